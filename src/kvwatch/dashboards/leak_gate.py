""" "kvwatch / Leak gate": the verdicts the gate pushed, heap bytes per context
token by turn, and the live signals the detectors judge (root-ref drift,
interior snapshots, pages still pinned).

The gate series come from a Pushgateway (``kvwatch gate --pushgateway``);
findings also appear as annotations at their turns (``--grafana-url``).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from kvwatch.dashboards import panels as p
from kvwatch.instrumentation import names as n

UID = "kvwatch-leak-gate"
TITLE = "kvwatch / Leak gate"
PINNED = 'state=~"pinned_.*|host"'


def build() -> Dashboard:
    board = p.dashboard(
        TITLE,
        UID,
        refresh="30s",
        since="now-6h",
        variables=[p.label_variable("profile", n.GATE_RUN_REQUESTS, "profile")],
    )
    return p.with_rows(
        board,
        {
            "Verdicts": [*_verdict_stats(), *_per_run()],
            "Live leak signals": _live_signals(),
        },
    )


def _verdict_stats() -> list:
    """The gate's headline: its verdict, and how many detector runs failed and
    how many runs broke."""
    verdict = p.single(
        "Gate verdict",
        "none",
        f"max by (verdict) ({p.series(n.GATE_VERDICT)})",
        "{{verdict}}",
        span=8,
    )
    failing = p.single(
        "Failing detector runs",
        "none",
        f"sum({p.series(n.GATE_DETECTOR_FAILED, p.PROFILE)})",
        "failing",
        span=8,
    )
    broken = p.single(
        "Broken runs",
        "none",
        f"sum({p.series(n.GATE_RUN_BROKEN, p.PROFILE)})",
        "broken",
        span=8,
    )
    return [verdict, failing, broken]


def _per_run() -> list:
    """Each run's detail: detector verdicts, first failing turns, heap bytes per
    context token by turn, and requests against failed requests."""
    detectors = p.grid(
        "Detector verdicts by run",
        p.series(n.GATE_DETECTOR_FAILED, p.PROFILE),
        p.verdict_text(),
    )
    first_turn = p.bars(
        "First failing turn",
        "none",
        p.series(n.GATE_FIRST_FAIL_TURN, p.PROFILE),
        "{{detector}} {{profile}} c={{concurrency}}",
    )
    heap = p.bars(
        "Heap bytes per held token, by turn",
        "decbytes",
        p.series(n.GATE_HEAP_PER_TOKEN, p.PROFILE),
        "{{profile}} c={{concurrency}} turn {{turn}}",
        span=24,
    )
    requests = p.bars(
        "Requests and failed requests per run",
        "none",
        f'label_replace({p.series(n.GATE_RUN_REQUESTS, p.PROFILE)}, "kind", "requests", "", "")'
        f' or label_replace({p.series(n.GATE_RUN_ERRORS, p.PROFILE)}, "kind", "failed", "", "")',
        "{{profile}} c={{concurrency}} {{kind}}",
        span=24,
    )
    return [detectors, first_turn, heap, requests]


def _live_signals() -> list:
    """What the detectors judge, live from the engine: root-ref drift, interior
    snapshots and pinned pages."""
    drift = p.graph(
        "Root-ref drift (actual - expected)",
        "none",
        (
            f"sum({p.series(n.ROOT_REFS, p.INSTANCE)})"
            f" - sum({p.series(n.ROOT_REFS_EXPECTED, p.INSTANCE)})",
            "drift",
        ),
    ).span(8)
    interior = p.graph(
        "Interior snapshots",
        "none",
        (f"sum by (group) ({p.series(n.TREE_INTERIOR_SNAPSHOTS, p.INSTANCE)})", "{{group}}"),
    ).span(8)
    pinned = p.graph(
        "Pages pinned by requests, sessions and host",
        "none",
        (
            f"sum by (state) ({p.series(n.POOL_PAGES, p.INSTANCE, PINNED)})",
            "{{state}}",
        ),
    ).span(8)
    return [drift, interior, pinned]
