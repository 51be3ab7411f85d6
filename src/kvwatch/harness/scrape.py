"""Reading named series out of a Prometheus text page.

A series spec is ``name`` or ``name{label="value",...}``. Every sample with
that name whose labels include the given ones is a series of its own, keyed
by the PromQL selector of all its labels (OTel's ``otel_scope_*`` bookkeeping
labels are dropped; the spec itself when it names them all), so
``kvwatch_tree_interior_snapshots`` gives one series per group,
``kvwatch_tree_interior_snapshots{group="linear.state"}``, which pastes into
Prometheus as it is. ``SERIES`` reads the number of series on the page itself.
Parsing is prometheus_client's.
"""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

# Not a series but the number of series on the page, as PromQL counts them on one
# target (``count({__name__=~".+"})``): a server that makes a series per
# request or per session and never drops it grows it without bound.
SERIES = 'count({__name__=~".+"})'
SPEC = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?$")
LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"([^"]*)"\s*,?')
IGNORED = ("otel_scope_",)


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    m = SPEC.match(spec.strip())
    if m is None:
        raise ValueError(f'bad series {spec!r}: want name or name{{label="value",...}}')
    labels, rest = {}, m.group("labels") or ""
    while rest.strip():
        lm = LABEL.match(rest)
        if lm is None:
            raise ValueError(f"bad label selector in {spec!r}")
        labels[lm.group(1)] = lm.group(2)
        rest = rest[lm.end() :]
    return m.group("name"), labels


def selector(name: str, labels: dict[str, str]) -> str:
    """A series as PromQL selects it: ``name{a="1",b="2"}``, labels sorted."""
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}" if inner else name


def read_series(page: str, specs: tuple[str, ...]) -> dict[str, float]:
    wanted = [(spec, *parse_spec(spec)) for spec in specs if spec != SERIES]
    out: dict[str, float] = {}
    counted = 0
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            counted += 1
            for spec, name, labels in wanted:
                if sample.name != name or any(sample.labels.get(k) != v for k, v in labels.items()):
                    continue
                other = {
                    k: v
                    for k, v in sample.labels.items()
                    if k not in labels and not k.startswith(IGNORED)
                }
                key = spec if not other else selector(name, {**labels, **other})
                out[key] = out.get(key, 0.0) + sample.value
    if SERIES in specs:
        out[SERIES] = float(counted)
    return out
