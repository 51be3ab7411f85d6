"""``OUT/report.html``: one self-contained page (plots inlined as PNG data URIs).

GateSummary ──────────► the verdict, each failure's evidence, the runs
                        (requests, failures, coverage, Locust report links),
                        every verdict with its evidence     (report_text.py)
each run's RunRecord ─► per profile: pages per group at each barrier (by owner,
                        pinned and evictable, leaked, over the bound, capacity,
                        the failing turn), usage at every probe  (report_data.py,
runs/*/locust_stats.csv   latency percentiles per c; heap per token   report_plots.py)

The page reads the same printed as on screen: what a figure shows by colour
is in its labels or in the text, and no text hides in a tooltip.
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from pathlib import Path

from kvwatch.gate.outputs import report_plots as plots
from kvwatch.gate.outputs import report_pool
from kvwatch.gate.outputs import report_text as text
from kvwatch.gate.outputs.report_data import latency_series, pool_series, step_series
from kvwatch.gate.outputs.summary import GateSummary
from kvwatch.gate.verdicts.judge import RunResult
from kvwatch.harness.run_record import RunRecord

STYLE = """
body{font-family:sans-serif;margin:2em;max-width:1500px}
table{border-collapse:collapse;margin:0.5em 0}
td,th{border:1px solid #bbb;padding:3px 8px;font-size:13px;text-align:left;vertical-align:top}
table.small td{font-size:12px}
td.fail{background:#f6c9c9;font-weight:bold} td.pass{background:#d8f0d8} td.skipped{background:#eee}
h1.verdict{padding:6px 12px;border:3px solid #333} h1.fail,h1.error{background:#f6c9c9} h1.pass{background:#d8f0d8}
p.said{font-size:18px;font-weight:bold}
div.failure{border-left:6px solid #a00;padding:2px 12px;margin:12px 0}
p.evidence{font-family:monospace;font-size:14px;white-space:pre-wrap}
p.story{font-size:16px;font-weight:bold;color:#a00}
p.small,p.note{font-size:13px} p.note{color:#333;border:1px solid #bbb;padding:4px 8px}
li .detail{font-family:monospace}
pre{font-size:12px;background:#f4f4f4;padding:4px}
img{max-width:100%}
figure{margin:1em 0;break-inside:avoid} figcaption{font-size:13px;color:#333}
@media print{body{margin:0.5cm;print-color-adjust:exact;-webkit-print-color-adjust:exact}
h2{break-after:avoid}}
"""


def write_report(summary: GateSummary, out: Path) -> Path:
    """Write ``out/report.html`` from the summary, its runs' records and the run folders."""
    runs = summary.runs
    loaded = {(r.profile, r.concurrency): r.record for r in runs}
    parts = [
        text.head(summary),
        text.evidence(summary),
        text.notices(summary),
        text.runs_table(summary, out),
        text.performance_table(summary),
        text.time_table(summary),
    ]
    for profile in dict.fromkeys(r.profile for r in runs):
        records = {c: rec for (p, c), rec in loaded.items() if p == profile and rec is not None}
        fails = {r.concurrency: _fails(r) for r in runs if r.profile == profile}
        parts.append(f"<h2>{escape(profile)}</h2>")
        performance = {r.concurrency: r.performance for r in runs if r.profile == profile}
        parts += _profile_figures(profile, records, fails, performance)
    heap = _heap_series(runs)
    if heap:
        parts.append(
            "<h2>heap</h2>" + _img(plots.heap_figure(heap), "heap bytes per held token", "")
        )
    parts += [text.coverage_section(summary), text.all_verdicts(summary)]
    page = "\n".join(
        [
            "<!doctype html><html><head><meta charset='utf-8'><title>kvwatch gate: "
            f"{escape(summary.verdict)}</title><style>{STYLE}</style></head><body>",
            *[p for p in parts if p],
            "</body></html>",
        ]
    )
    path = out / "report.html"
    path.write_text(page)
    return path


def _fails(run: RunResult) -> list[tuple[int, str]]:
    """Where each failed detector of a run goes on the turn axis, with its label."""
    return [
        (v.first_turn, f"{name} fails {text.where(v)}")
        for name, v in run.failed().items()
        if v.first_turn is not None
    ]


POOL_CAPTION = (
    "One column per barrier probe: pages by owner, the tree's pinned pages solid and its "
    "evictable cache only outlined (eviction takes it back on demand: a full cache is no "
    "leak). The narrow bars inside a column are parts of it, not more pages: red, pages held "
    "by no live holder (the probe's orphan findings; still under their last owner's tag), and "
    "hatched, pinned pages over the bound live holders justify, each the most any probe of "
    "that turn saw. The dash-dot line is the pool's capacity; a dashed line marks where a "
    "detector first failed."
)
STEPS_CAPTION = (
    "Used pages, as a share of each group's capacity, at every probe the recorder kept (its "
    "samples while the turns ran and the engine's latched probes), in engine steps; dotted "
    "lines are the barriers."
)
LATENCY_CAPTION = (
    "Time to first token and inter-token latency of the streamed completions, and end to end "
    "of every answered completion, as the load's clients measured them (the Performance table "
    "has the same figures). A concurrency without a figure is a gap, not 0."
)


def _profile_figures(
    profile: str, records: dict[int, RunRecord], fails, performance: Mapping
) -> list[str]:
    """The pool figures (probed runs) or the gauges (black-box ones), then latency."""
    pools = {c: s for c, rec in records.items() if (s := pool_series(rec))}
    if pools:
        parts = _pool_figures(profile, records, pools, fails)
    elif any(rec.turns for rec in records.values()):
        gauges = plots.gauge_figure(profile, {c: r.turns for c, r in records.items()})
        parts = [_img(gauges, "gauges per turn", "")]
    else:
        parts = []
    if latency := latency_series(performance):
        parts.append(
            _img(plots.latency_figure(profile, latency), "latency percentiles", LATENCY_CAPTION)
        )
    return parts


def _pool_figures(profile: str, records: dict[int, RunRecord], pools, fails) -> list[str]:
    parts = []
    held = report_pool.held_groups(pools)
    empty = [g.group for g in next(iter(pools.values())) if g.group not in held]
    if held:
        figure = report_pool.pool_figure(profile, pools, fails)
        parts.append(_img(figure, "pages per group at each barrier", POOL_CAPTION))
    if empty:
        parts.append(
            f"<p>nothing held in groups {escape(', '.join(empty))} (at any barrier, at any concurrency)</p>"
        )
    steps = {c: s for c, rec in records.items() if (s := step_series(rec)) is not None and s.used}
    if steps:
        figure = plots.steps_figure(profile, steps, fails)
        parts.append(_img(figure, "pool usage at every probe", STEPS_CAPTION))
    return parts


def _heap_series(runs) -> dict[str, list[tuple[int, float]]]:
    """Heap bytes per held token by turn, per run: the summary's series (one ratio
    everywhere, ``heap.bytes_per_held_token``)."""
    return {r.name: list(r.heap_per_token) for r in runs if r.heap_per_token}


def _img(fig, alt: str, caption: str) -> str:
    data = plots.png(fig)
    cap = f"<figcaption>{escape(caption)}</figcaption>" if caption else ""
    return f"<figure><img alt='{escape(alt)}' src='data:image/png;base64,{data}'>{cap}</figure>"
