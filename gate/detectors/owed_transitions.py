"""``coverage``: a whole default gate takes every transition the machines owe.

The machines of ``kvwatch.telemetry.coverage`` list what a correct engine
does under the gate's load: each request stage aborted, retracted and
recovered, each session call against a turn in each state, each failpoint
site failed, each branch offset within a page. The default profiles drive
every owed transition on purpose (test controls script the rare ones), and a
clean default gate takes all of them at any concurrency. So when a gate ran
a target's whole default profile set on its default engine, an owed
transition that never happened is a path the engine lost: an abort that did
not land, a close or a retraction that never took place, a failpoint site
that no longer fails. A leak detector sees only what was reached; this one
fails the gate that could not reach what it vouches for.

It judges the gate, not a run: one profile owes only part of the machines,
so a gate of chosen profiles, another engine setting or another target owes
nothing (``Target.owes_coverage``) and the verdict is absent. Transitions
seen outside the machines are reported, not judged: some are gaps in the
model that a correct engine takes under pressure.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvwatch.gate.detectors.verdict import FAIL, Evidence, Verdict, passed

ID = "coverage"
MOST_NAMED = 16  # never-taken transitions carried as evidence; summary.json lists all


def never_taken(total: Mapping[str, Mapping]) -> list[str]:
    """``machine: from -> to`` for each owed transition of ``total`` (the summary's
    ``coverage.total``) that no run took."""
    return [f"{machine}: {edge}" for machine, c in total.items() for edge in c["never"]]


def judge(total: Mapping[str, Mapping]) -> Verdict:
    """Pass when every owed transition was taken; else fail with each one that was not."""
    owed = sum(c["total"] for c in total.values())
    never = never_taken(total)
    if not never:
        return passed(ID, f"{owed} of {owed} owed transitions taken")
    evidence = [
        Evidence(group=None, pages=(), detail=f"never taken: {edge}") for edge in never[:MOST_NAMED]
    ]
    return Verdict(
        detector=ID,
        verdict=FAIL,
        first_turn=None,
        evidence=tuple(evidence),
        note=f"{owed - len(never)} of {owed} owed transitions taken",
    )


def verdict_of(coverage: Mapping | None) -> Verdict | None:
    """The gate's coverage verdict from its summary's ``coverage`` section, or None
    where the gate owed none (``"owed": false``, or no white-box runs)."""
    if not coverage or not coverage.get("owed"):
        return None
    return judge(coverage["total"])
