"""Panel and variable helpers shared by the kvwatch dashboards.

Every query is PromQL over series named by ``kvwatch.instrumentation.names``
(through ``names.prom``), and every panel reads the ``$datasource`` variable,
so one dashboard JSON works against any Prometheus. Engine series are
filtered by ``instance=~"$instance"``; the gate's pushed series by
``profile=~"$profile"``.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import bargauge, stat, table, timeseries
from grafana_foundation_sdk.builders.common import StackingConfig, VizLegendOptions
from grafana_foundation_sdk.builders.dashboard import (
    AnnotationQuery,
    AnnotationTarget,
    Dashboard,
    DatasourceVariable,
    QueryVariable,
    Row,
)
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.models.common import LegendDisplayMode, StackingMode
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    ValueMap,
    ValueMappingResult,
    VariableRefresh,
)

from kvwatch.instrumentation import names as n

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
INSTANCE = 'instance=~"$instance"'
PROFILE = 'profile=~"$profile"'
RATE = "$__rate_interval"
GATE_ANNOTATION_TAG = "kvwatch-gate"  # every annotation `kvwatch gate --grafana-url` adds


def series(name: str, *matchers: str) -> str:
    """``name{m1,m2}`` with the Prometheus name of instrument ``name``."""
    return f"{n.prom(name)}{{{','.join(matchers)}}}" if matchers else n.prom(name)


def rate(name: str, *matchers: str) -> str:
    return f"rate({series(name, *matchers)}[{RATE}])"


def quantile(q: float, histogram: str) -> str:
    """The q-quantile of a latency histogram over the rate window."""
    buckets = f"rate({n.prom(histogram)}_bucket{{{INSTANCE}}}[{RATE}])"
    return f"histogram_quantile({q}, sum by (le) ({buckets}))"


def query(expr: str, legend: str = "__auto", ref: str = "A", instant: bool = False) -> Dataquery:
    q = Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)
    return q.instant() if instant else q.range()


def queries(*pairs: tuple[str, str]) -> list[Dataquery]:
    """(expr, legend) pairs as queries A, B, C, ..."""
    return [query(e, legend, chr(ord("A") + i)) for i, (e, legend) in enumerate(pairs)]


def graph(title: str, unit: str, *pairs: tuple[str, str], stacked: bool = False):
    panel = (
        timeseries.Panel()
        .title(title)
        .unit(unit)
        .datasource(DATASOURCE)
        .targets(queries(*pairs))
        .legend(VizLegendOptions().display_mode(LegendDisplayMode.LIST).show_legend(True))
        .height(8)
        .span(12)
    )
    if stacked:
        panel = panel.stacking(StackingConfig().mode(StackingMode.NORMAL)).fill_opacity(40)
    return panel


def single(title: str, unit: str, expr: str, legend: str = "__auto", span: int = 6):
    return (
        stat.Panel()
        .title(title)
        .unit(unit)
        .datasource(DATASOURCE)
        .with_target(query(expr, legend))
        .height(5)
        .span(span)
    )


def bars(title: str, unit: str, expr: str, legend: str, span: int = 12):
    return (
        bargauge.Panel()
        .title(title)
        .unit(unit)
        .datasource(DATASOURCE)
        .with_target(query(expr, legend, instant=True))
        .height(8)
        .span(span)
    )


def grid(title: str, expr: str, mappings: list[ValueMap] | None = None, span: int = 12):
    panel = (
        table.Panel()
        .title(title)
        .datasource(DATASOURCE)
        .with_target(query(expr, instant=True).format("table"))
        .height(8)
        .span(span)
    )
    return panel.mappings(mappings) if mappings else panel


def verdict_text() -> list[ValueMap]:
    """0 reads as pass, 1 as FAIL."""
    return [
        ValueMap(
            {
                "0": ValueMappingResult(text="pass", color="green"),
                "1": ValueMappingResult(text="FAIL", color="red"),
            }
        )
    ]


def datasource_variable() -> DatasourceVariable:
    return DatasourceVariable("datasource").label("Prometheus").type("prometheus")


def label_variable(name: str, metric: str, label: str, *matchers: str) -> QueryVariable:
    """A multi-select of the values ``label`` takes on ``metric``, All by default."""
    return (
        QueryVariable(name)
        .label(name)
        .datasource(DATASOURCE)
        .query(f"label_values({series(metric, *matchers)}, {label})")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )


def instance_variable() -> QueryVariable:
    return label_variable("instance", n.POOL_CAPACITY, "instance")


def gate_annotations() -> AnnotationQuery:
    """Leak findings and run verdicts the gate posted (Grafana's own annotation store)."""
    return (
        AnnotationQuery()
        .name("kvwatch gate")
        .datasource(DataSourceRef(type_val="grafana", uid="-- Grafana --"))
        .enable(True)
        .icon_color("red")
        .target(AnnotationTarget().type("tags").tags([GATE_ANNOTATION_TAG]).limit(200))
    )


def dashboard(
    title: str, uid: str, *, refresh: str = "10s", since: str = "now-30m", variables=()
) -> Dashboard:
    """A kvwatch dashboard: tagged, ``$datasource`` and ``$instance`` first (later
    variables may filter on them), then ``variables``, and the gate's annotations."""
    out = Dashboard(title).uid(uid).tags(["kvwatch"]).refresh(refresh).time(since, "now")
    for variable in (datasource_variable(), instance_variable(), *variables):
        out = out.with_variable(variable)
    return out.annotation(gate_annotations())


def with_rows(board: Dashboard, rows: dict[str, list]) -> Dashboard:
    """``board`` with each row of ``rows`` (its title, then its panels) in order:
    Grafana lays a panel out under the row added last before it, so the panels
    follow their row's title."""
    for title, row_panels in rows.items():
        board = board.with_row(Row(title))
        for panel in row_panels:
            board = board.with_panel(panel)
    return board
