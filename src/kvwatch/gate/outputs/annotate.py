"""The gate's findings as Grafana annotations, placed at the turn they happened.

    run region    [first barrier .............. last barrier]   "agentic-trie c=4: pass"
    finding                    ^ turn 3 barrier                  "allocator failed at turn 3 ..."

Annotations are organisation-wide and tagged ``kvwatch-gate`` (plus the
detector, profile and concurrency), so every kvwatch dashboard, whose
annotation query asks for that tag, shows them over its own panels.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

from kvwatch.dashboards.panels import GATE_ANNOTATION_TAG

if TYPE_CHECKING:
    from grafana_client import GrafanaApi

    from kvwatch.gate.outputs.summary import GateSummary


class Annotation(NamedTuple):
    time_ms: int
    time_end_ms: int | None
    tags: tuple[str, ...]
    text: str


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def annotations(summary: GateSummary) -> Iterator[Annotation]:
    """A region per run with its verdicts, and a point per failing detector at its turn."""
    for run in summary.runs:
        at = dict(run.timeline)
        if not at:
            continue
        tags = (GATE_ANNOTATION_TAG, run.profile, f"c={run.concurrency}")
        failed = run.failed()
        verdict = "error" if run.error or run.errored() else ("fail" if failed else "pass")
        text = f"{run.name}: {verdict}" + (f" ({', '.join(failed)})" if failed else "")
        yield Annotation(
            time_ms=_ms(min(at.values())),
            time_end_ms=_ms(max(at.values())),
            tags=(*tags, verdict),
            text=text,
        )
        for detector, v in failed.items():
            when = at.get(v.first_turn, max(at.values()))
            yield Annotation(
                time_ms=_ms(when),
                time_end_ms=None,
                tags=(*tags, detector, "leak"),
                text=f"{detector} failed at turn {v.first_turn} ({run.name}): {v.summary()}",
            )


def post(api: GrafanaApi, summary: GateSummary) -> int:
    """Add the annotations; returns how many were added."""
    count = 0
    for a in annotations(summary):
        api.annotations.add_annotation(
            time_from=a.time_ms, time_to=a.time_end_ms, tags=list(a.tags), text=a.text
        )
        count += 1
    return count
