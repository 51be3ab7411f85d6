""" "kvwatch / Serving": latency percentiles, throughput, queue, prefix hits,
retractions, aborts and evictions."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from kvwatch.dashboards import panels as p
from kvwatch.instrumentation import names as n

UID = "kvwatch-serving"
TITLE = "kvwatch / Serving"
QUANTILES = (0.5, 0.9, 0.99)


def _latency(title: str, histogram: str):
    pairs = [(p.quantile(q, histogram), f"p{round(q * 100)}") for q in QUANTILES]
    return p.graph(title, "s", *pairs).span(8)


def _sum_rate(name: str, by: str = "") -> str:
    head = f"sum by ({by}) " if by else "sum"
    return f"{head}({p.rate(name, p.INSTANCE)})"


def build() -> Dashboard:
    throughput = p.graph(
        "Throughput",
        "short",
        (_sum_rate(n.TOKENS_GENERATED), "output tokens/s"),
        (_sum_rate(n.PREFILL_COMPUTED), "prefill tokens computed/s"),
    )
    finished = p.graph(
        "Requests finished by reason",
        "reqps",
        (_sum_rate(n.REQUESTS_FINISHED, n.REASON), "{{reason}}"),
    )
    queue = p.graph(
        "Requests by state",
        "none",
        (f"sum by (state) ({p.series(n.REQUESTS_LIVE, p.INSTANCE)})", "{{state}}"),
        stacked=True,
    )
    hit_rate = p.graph(
        "Prefix hit rate",
        "percentunit",
        (
            f"{_sum_rate(n.PREFIX_HIT)} / {_sum_rate(n.PREFIX_QUERIED)}",
            "hit tokens / prompt tokens",
        ),
    )
    retractions = p.graph(
        "Retractions",
        "reqps",
        (_sum_rate(n.RETRACTIONS), "retracted/s"),
    ).span(8)
    aborts = p.graph(
        "Aborts by stage",
        "reqps",
        (_sum_rate(n.ABORTS, n.STAGE), "{{stage}}"),
    ).span(8)
    evictions = p.graph(
        "Evictions by kind",
        "short",
        (_sum_rate(n.EVICTIONS, n.KIND), "{{kind}}"),
    ).span(8)
    return (
        p.dashboard(TITLE, UID)
        .with_row(Row("Latency"))
        .with_panel(_latency("Time to first token", n.TTFT))
        .with_panel(_latency("Time per output token", n.TPOT))
        .with_panel(_latency("End-to-end request duration", n.REQUEST_DURATION))
        .with_row(Row("Load"))
        .with_panel(throughput)
        .with_panel(finished)
        .with_panel(queue)
        .with_panel(hit_rate)
        .with_row(Row("Pressure"))
        .with_panel(retractions)
        .with_panel(aborts)
        .with_panel(evictions)
    )
