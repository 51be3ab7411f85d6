"""The engine's counters tell the truth: over a run, each counts what the engine did.

The OTel listeners that feed ``/metrics`` and the lifecycle counter that feeds
``GET /debug/coverage`` hear the same engine events on subscriptions of their
own, so over one run (the server idle at both ends) the counters' rises must
equal the transitions the lifecycle counter took::

    kvwatch_retractions_total                    every request edge into ``retracted``
    kvwatch_aborts_total (all stages)            every request edge into ``aborted``
    kvwatch_requests_finished_total{reason}      stop + length: edges into ``finished``;
                                                 abort: into ``aborted``; error: into ``failed``
    gen_ai_server_request_duration_seconds_count edges into ``finished``
    kvwatch_tokens_generated_total               the tokens of every request that ended
                                                 (the server counts them as each ends)

A listener that drops, double-counts or mislabels an event shows here; a
dashboard built on these series would otherwise believe it. The rises are
read by the target around its run (``RunRecord.counters``: kvwatch's server).
"""

from __future__ import annotations

from collections.abc import Mapping

from kvwatch.gate.detectors.verdict import Evidence
from kvwatch.harness.run_record import RunRecord
from kvwatch.harness.scrape import parse_spec
from kvwatch.instrumentation import names as n

RETRACTIONS = n.prom(n.RETRACTIONS)
ABORTS = n.prom(n.ABORTS)
FINISHED = n.prom(n.REQUESTS_FINISHED)
DURATION_COUNT = n.prom(n.REQUEST_DURATION) + "_count"
TOKENS = n.prom(n.TOKENS_GENERATED)


def rises(counters: Mapping[str, float]) -> dict[str, float]:
    """The rises by what they count: a name, or ``finished:REASON``."""
    out: dict[str, float] = {}
    for series, rise in counters.items():
        name, labels = parse_spec(series)
        key = f"finished:{labels.get('reason')}" if name == FINISHED else name
        out[key] = out.get(key, 0.0) + rise
    return out


def owed(edges: Mapping[str, int], tokens: int | None = None) -> dict[str, int]:
    """What each counter must have risen by, from the request machine's edges."""

    def into(state: str) -> int:
        return sum(count for edge, count in edges.items() if edge.endswith(f"-> {state}"))

    finished = into("finished")
    tokens_owed = {} if tokens is None else {TOKENS: tokens}
    return {
        **tokens_owed,
        RETRACTIONS: into("retracted"),
        ABORTS: into("aborted"),
        "finished:stop+length": finished,
        "finished:abort": into("aborted"),
        "finished:error": into("failed"),
        DURATION_COUNT: finished,
    }


def untrue(run: RunRecord) -> list[Evidence]:
    """Every counter whose rise over the run differs from the engine's transitions;
    empty where the record has no counter readings or no coverage."""
    if run.counters is None or "request" not in run.coverage:
        return []
    got = rises(run.counters)
    got["finished:stop+length"] = got.pop("finished:stop", 0.0) + got.pop("finished:length", 0.0)
    ev = []
    tokens = run.output_tokens if run.finished or run.output_tokens else None
    for what, want in owed(run.coverage["request"], tokens).items():
        have = got.get(what)
        if have is None and want == 0:
            continue  # a labelled series appears with its first count
        if have != want:
            shown = "no series" if have is None else f"rose {have:g}"
            detail = f"{what} {shown} over the run; the engine's transitions say {want}"
            ev.append(Evidence(group=None, pages=(), detail=detail))
    return ev
