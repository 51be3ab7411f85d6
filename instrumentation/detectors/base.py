"""What detectors read and what they answer.

A run is a series of turns. Each turn carries the probe reports taken while
it ran (the last one at the barrier, after the engine drained), how many
conversations were live and how much context they held, and optionally a
heap sample and black-box gauge readings. Probe reports are the typed probe
contract (``kvwatch.contracts.ProbeReport``), read back from the JSON of
``GET /debug/probe`` or taken in process, so both look the same to a detector.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import NamedTuple

from kvwatch.contracts import FindingKind, ProbeReport

PASS, FAIL, SKIPPED = "pass", "fail", "skipped"


class Evidence(NamedTuple):
    group: str | None
    pages: tuple[int, ...]
    detail: str  # what was seen, with the owner chain where there is one
    traceback: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return {
            "group": self.group,
            "pages": list(self.pages),
            "detail": self.detail,
            "traceback": list(self.traceback),
        }


class Verdict(NamedTuple):
    detector: str
    verdict: str  # pass, fail or skipped
    first_turn: int | None  # the turn where it first failed
    evidence: tuple[Evidence, ...] = ()
    note: str = ""  # why it passed or was skipped

    @property
    def failed(self) -> bool:
        return self.verdict == FAIL

    def summary(self) -> str:
        if not self.evidence:
            return self.note
        head = self.evidence[0]
        where = f"{head.group}: " if head.group else ""
        more = f" (+{len(self.evidence) - 1} more)" if len(self.evidence) > 1 else ""
        return f"turn {self.first_turn}: {where}{head.detail}{more}"

    def as_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "first_turn": self.first_turn,
            "evidence": self.summary(),
            "details": [e.as_dict() for e in self.evidence],
        }


class HeapSample(NamedTuple):
    traced_bytes: int  # bytes allocated by the engine's code and still alive
    # (bytes grown, traceback) since the previous turn, largest first
    top: tuple[tuple[int, tuple[str, ...]], ...] = ()
    by_site: dict[str, int] | None = None  # live bytes per allocation site (file:line)


class Replay(NamedTuple):
    turn: int
    prompt: tuple[int, ...]
    cached: tuple[int, ...]  # what the run produced
    reference: tuple[int, ...]  # what a cache-off engine produces


class Turn(NamedTuple):
    turn: int
    probes: tuple[ProbeReport, ...]  # during the turn; the last one at the barrier
    conversations: int = 0  # live conversations (agents and sub-agents) after the turn
    context_tokens: int = 0  # tokens those conversations hold
    heap: HeapSample | None = None
    gauges: dict[str, float] | None = None  # black-box readings at the barrier
    at: float | None = None  # wall clock (epoch seconds) when the barrier probe was taken

    @property
    def barrier(self) -> ProbeReport | None:
        return self.probes[-1] if self.probes else None


class RunRecord(NamedTuple):
    turns: tuple[Turn, ...]
    warmup: int = 2  # turns discarded before judging a trend
    baseline: ProbeReport | None = None  # probe before the first turn
    drained: ProbeReport | None = None  # probe after sessions closed and the cache flushed
    replays: tuple[Replay, ...] = ()
    error: str | None = None  # the run broke (the gate exits 3)
    # black-box: drain gauges before the first turn and after the run ended
    gauges_baseline: dict[str, float] | None = None
    gauges_drained: dict[str, float] | None = None

    @classmethod
    def from_json(cls, data: dict) -> RunRecord:
        """A run recorded over HTTP (the gate's recorder writes this shape)."""
        turns = tuple(
            Turn(
                t["turn"],
                tuple(ProbeReport.from_json(p) for p in t["probes"]),
                t.get("conversations", 0),
                t.get("context_tokens", 0),
                _heap(t.get("heap")),
                t.get("gauges") or None,
                t.get("at"),
            )
            for t in data.get("turns", ())
        )
        replays = tuple(
            Replay(turn, tuple(prompt), tuple(cached), tuple(reference))
            for turn, prompt, cached, reference in data.get("replays", ())
        )
        return cls(
            turns,
            data.get("warmup", 2),
            _probe(data.get("baseline")),
            _probe(data.get("drained")),
            replays,
            data.get("error"),
            data.get("gauges_baseline") or None,
            data.get("gauges_drained") or None,
        )


def _probe(data: dict | None) -> ProbeReport | None:
    return ProbeReport.from_json(data) if data else None


def _heap(data: dict | None) -> HeapSample | None:
    if not data:
        return None
    top = tuple((size, tuple(tb)) for size, tb in data.get("top", ()))
    return HeapSample(data["traced_bytes"], top, data.get("by_site"))


def fail(detector: str, turn: int, evidence: list[Evidence]) -> Verdict:
    return Verdict(detector, FAIL, turn, tuple(evidence[:16]))


def passed(detector: str, note: str = "") -> Verdict:
    return Verdict(detector, PASS, None, (), note)


def skipped(detector: str, note: str) -> Verdict:
    return Verdict(detector, SKIPPED, None, (), note)


def findings_detector(detector: str, kinds: Collection[FindingKind], run: RunRecord) -> Verdict:
    """Fail at the first turn whose probes carry a finding of one of ``kinds``."""
    for turn in run.turns:
        for probe in turn.probes:
            hits = [f for f in probe.findings if f.kind in kinds]
            if hits:
                ev = [Evidence(f.group, f.pages, f.detail) for f in hits]
                return fail(detector, turn.turn, ev)
    if run.drained is not None:
        hits = [f for f in run.drained.findings if f.kind in kinds]
        if hits:
            last = run.turns[-1].turn + 1 if run.turns else 0
            ev = [Evidence(f.group, f.pages, f"after drain: {f.detail}") for f in hits]
            return fail(detector, last, ev)
    names = ", ".join(sorted(str(k) for k in kinds))
    return passed(detector, f"no {names} findings in {len(run.turns)} turns")
