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
    kvwatch_evictions_total{kind}                node: every ``NodeEvicted``; snapshot: every
                                                 snapshot taken back (pruned, evicted, flushed);
                                                 slot: the slot machine's edges into ``evicted``

The evictions are tallied by the server's prefill ledger and lifecycle counter
(``GET /debug/coverage``), listeners of their own: a listener that drops a
kind, or counts one under another, shows. Both hear the same events, so an
eviction the engine makes without its event is not seen here.

The prefix-cache and prefill counters are held to a conservation identity:
every request whose first admission ran its prompt to the end was queried for
its whole prompt, hit for the tokens it skipped and computed the rest, so::

    queried - uncovered queried == hit - uncovered hit + computed - recomputed

where the ledger (``instrumentation/prefill_ledger.py``) counts only what lies
outside those requests: first admissions cut mid-prefill (retracted, aborted,
failed) and every chunk after a retraction or a pause. It never counts the
covered requests' own tokens, so a listener that counts the wrong thing, or an
event that lies about them (a ``cached_tokens`` that takes in a partial page
the request then computes again, a chunk sent twice or not at all), breaks it.

A listener that drops, double-counts or mislabels an event shows here; a
dashboard built on these series would otherwise believe it. The rises are
read by the target around its run (``RunRecord.counters``: kvwatch's server).
"""

from __future__ import annotations

from collections.abc import Mapping

from kvwatch.gate.verdicts.detectors.verdict import Evidence
from kvwatch.harness.run_record import RunRecord
from kvwatch.harness.scrape import parse_spec
from kvwatch.instrumentation import names as n
from kvwatch.instrumentation.prefill_ledger import EVICTIONS as LEDGER_EVICTIONS
from kvwatch.instrumentation.prefill_ledger import PREFILL

RETRACTIONS = n.prom(n.RETRACTIONS)
ABORTS = n.prom(n.ABORTS)
FINISHED = n.prom(n.REQUESTS_FINISHED)
DURATION_COUNT = n.prom(n.REQUEST_DURATION) + "_count"
TOKENS = n.prom(n.TOKENS_GENERATED)
QUERIED = n.prom(n.PREFIX_QUERIED)
HIT = n.prom(n.PREFIX_HIT)
COMPUTED = n.prom(n.PREFILL_COMPUTED)
EVICTIONS = n.prom(n.EVICTIONS)


def rises(counters: Mapping[str, float]) -> dict[str, float]:
    """The rises by what they count: a name, ``finished:REASON`` or ``evictions:KIND``."""
    out: dict[str, float] = {}
    for series, rise in counters.items():
        name, labels = parse_spec(series)
        key = name
        if name == FINISHED:
            key = f"finished:{labels.get('reason')}"
        elif name == EVICTIONS:
            key = f"evictions:{labels.get('kind')}"
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


def evictions_owed(coverage: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """What each kind of eviction must have risen by; empty where the coverage has
    no ledger (a server that does not keep one)."""
    if LEDGER_EVICTIONS not in coverage:
        return {}
    tallied = coverage[LEDGER_EVICTIONS]
    slots = sum(c for edge, c in coverage.get("slot", {}).items() if "-> evicted (" in edge)
    return {
        "evictions:node": tallied.get("node", 0),
        "evictions:snapshot": tallied.get("snapshot", 0),
        "evictions:slot": slots,
    }


def unbalanced(got: Mapping[str, float], ledger: Mapping[str, int]) -> str | None:
    """What breaks the prefill identity (the module's docstring), or None."""
    queried = got.get(QUERIED, 0.0) - ledger.get("uncovered queried", 0)
    hit = got.get(HIT, 0.0) - ledger.get("uncovered hit", 0)
    computed = got.get(COMPUTED, 0.0) - ledger.get("recomputed", 0)
    if queried == hit + computed:
        return None
    return (
        f"the {ledger.get('covered', 0)} requests whose first prefill ran to its end were "
        f"queried for {queried:g} prompt tokens ({QUERIED}), but hit {hit:g} ({HIT}) "
        f"and computed {computed:g} ({COMPUTED}): {hit + computed:g}"
    )


def untrue(run: RunRecord) -> list[Evidence]:
    """Every counter whose rise over the run differs from the engine's transitions,
    and a broken prefill identity; empty where the record has no counter readings
    or no coverage."""
    if run.counters is None or "request" not in run.coverage:
        return []
    got = rises(run.counters)
    got["finished:stop+length"] = got.pop("finished:stop", 0.0) + got.pop("finished:length", 0.0)
    ev = []
    if PREFILL in run.coverage and (broken := unbalanced(got, run.coverage[PREFILL])):
        ev.append(Evidence(group=None, pages=(), detail=broken))
    tokens = run.output_tokens if run.finished or run.output_tokens else None
    owes = {**owed(run.coverage["request"], tokens), **evictions_owed(run.coverage)}
    for what, want in owes.items():
        have = got.get(what)
        if have is None and want == 0:
            continue  # a labelled series appears with its first count
        if have != want:
            shown = "no series" if have is None else f"rose {have:g}"
            detail = f"{what} {shown} over the run; the engine's transitions say {want}"
            ev.append(Evidence(group=None, pages=(), detail=detail))
    return ev
