"""What a probe over an engine run in process keeps from one step to the next.

The in-process targets (``sglang/probe.py``, ``lightllm/probe.py``) probe the
engine's structures after every step of its loop (``remember``, an observer
of their ``EngineLoop``). ``StepProbe`` is what they share:

* the last holder of each unit (``note``, ``last_seen``): a request or a
  session slot before the tree, so that an orphan names who held it last;
* with ``watch()``, a report after every step, the first ``MAX_LATCHED`` of
  them that show a finding kept (``latched()``, what kvwatch's recorder
  collects at the next barrier), so a state that is wrong only while
  requests run is judged too.

A probe defines ``report()`` (its ``ProbeReport``, noting the holders as it
reads them) and ``holdings()`` (every pool's holdings, read without an
audit). ``drive.LoopSource`` is what ``TurnRecorder`` asks (probes,
``watch``, ``latched``; the flush is the loop's).

Invariant: nothing here reads or changes the engine; the probes read it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kvwatch.contracts import ProbeReport
from kvwatch.targets.unit_audit import owners_of

MAX_LATCHED = 4  # mid-turn reports kept per barrier (the first ones with a finding)
UNSEEN = ("no holder seen", None)


class StepProbe:
    def __init__(self) -> None:
        self.last_holder: dict[tuple[str, int], tuple[str, Any]] = {}
        self.watching = False
        self.kept: list[ProbeReport] = []

    def report(self) -> ProbeReport:
        raise NotImplementedError

    def holdings(self) -> Iterable[tuple[str, Sequence[Any]]]:
        """Each pool's group and its holdings (``units``, ``owner``, ``who``, ``rid``)."""
        raise NotImplementedError

    def watch(self) -> None:
        self.watching = True

    def latched(self) -> list[ProbeReport]:
        out, self.kept = self.kept, []
        return out

    def remember(self) -> None:
        """After every step: note who holds each unit and, while watching, keep a
        report that shows a finding."""
        if self.watching:
            report = self.report()  # notes the holders too
            if report.findings and len(self.kept) < MAX_LATCHED:
                self.kept.append(report)
            return
        for group, holdings in self.holdings():
            self.note(group, holdings)

    def note(self, group: str, holdings: Sequence[Any]) -> None:
        """The last holder of each unit (a request or a slot before the tree)."""
        for u, hs in owners_of(holdings).items():
            h = next((h for h in hs if h.owner != "tree"), hs[0])
            self.last_holder[(group, u)] = (h.who, h.rid)

    def last_seen(self, group: str, unit: int) -> tuple[str, Any]:
        """Who held ``unit`` last, and the id of the request it was (or None)."""
        return self.last_holder.get((group, unit), UNSEEN)
