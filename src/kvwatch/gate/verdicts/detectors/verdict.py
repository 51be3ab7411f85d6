"""What detectors answer: a verdict with evidence, and helpers to build one.

They read a ``RunRecord`` (``kvwatch.harness.run_record``) whose probes
are the typed probe contract, read back from the JSON of ``GET /debug/probe``
or taken in process, so both look the same to a detector.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import NamedTuple

from kvwatch.contracts import NOTICE, SEVERE, Finding, FindingKind, ProbeReport
from kvwatch.harness.run_record import RunRecord

PASS, FAIL, SKIPPED = "pass", "fail", "skipped"
ERROR = "error"  # the detector itself raised: its evidence is the exception


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

    @classmethod
    def from_json(cls, data: dict) -> Evidence:
        return cls(
            group=data.get("group"),
            pages=tuple(data.get("pages", ())),
            detail=data.get("detail", ""),
            traceback=tuple(data.get("traceback", ())),
        )


class Verdict(NamedTuple):
    """A detector's answer over one run.

    Turns are numbered from 0, as the barriers count them. A failure found by
    the check after the run drained (sessions closed, cache flushed) has
    ``after_drain`` set and ``first_turn`` one past the last turn, so it still
    sorts after every turn's finding.
    """

    detector: str
    verdict: str  # pass, fail, skipped, or error (the detector raised)
    first_turn: int | None  # the turn where it first failed
    evidence: tuple[Evidence, ...] = ()
    note: str = ""  # why it passed or was skipped
    after_drain: bool = False
    story: str = ""  # how the failing quantity went: first turn, last, after the drain

    @property
    def failed(self) -> bool:
        return self.verdict == FAIL

    @property
    def errored(self) -> bool:
        return self.verdict == ERROR

    @property
    def where(self) -> str:
        """When it first failed, as people read it: ``turn 3`` or ``after the drain``
        (a detector that raised failed nowhere in the run: ``while judging``)."""
        if self.errored:
            return "while judging"
        return "after the drain" if self.after_drain else f"turn {self.first_turn}"

    def headline(self) -> str:
        """The first piece of evidence as one line, its group named once."""
        head = self.evidence[0]
        # Audit details name their group (and tier) already: "full.kv (host): ..."
        named = head.group and head.detail.startswith(head.group)
        group = f"{head.group}: " if head.group and not named else ""
        more = f" (+{len(self.evidence) - 1} more)" if len(self.evidence) > 1 else ""
        return f"{group}{head.detail}{more}"

    def summary(self) -> str:
        return f"{self.where}: {self.headline()}" if self.evidence else self.note

    def as_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "first_turn": self.first_turn,
            "after_drain": self.after_drain,
            "evidence": self.summary(),
            **({"story": self.story} if self.story else {}),
            "details": [e.as_dict() for e in self.evidence],
        }

    @classmethod
    def from_json(cls, detector: str, data: dict) -> Verdict:
        """Back from ``as_dict``: the evidence from its details, the note from the
        line when there are none."""
        details = tuple(Evidence.from_json(d) for d in data.get("details", ()))
        return cls(
            detector=detector,
            verdict=data["verdict"],
            first_turn=data.get("first_turn"),
            evidence=details,
            note="" if details else data.get("evidence", ""),
            after_drain=data.get("after_drain", False),
            story=data.get("story", ""),
        )


def not_back(
    before: Mapping[str, float], after: Mapping[str, float]
) -> list[tuple[str, float, float]]:
    """The drain rule, for pools, live work and gauges alike: what is above its
    value before the run once the run has drained, as (name, before, after).
    Coming back lower is fine (a flush may free cache the baseline held)."""
    return [
        (name, before[name], value)
        for name, value in sorted(after.items())
        if name in before and value > before[name] + 1e-9
    ]


def fail(detector: str, turn: int, evidence: list[Evidence]) -> Verdict:
    return Verdict(detector=detector, verdict=FAIL, first_turn=turn, evidence=tuple(evidence[:16]))


def drain_turn(run: RunRecord) -> int:
    """``first_turn`` of a finding made after the run drained: one past the last turn."""
    return run.turns[-1].turn + 1 if run.turns else 0


def fail_after_drain(detector: str, run: RunRecord, evidence: list[Evidence]) -> Verdict:
    """A failure of the check after the drain (see ``Verdict``)."""
    return Verdict(
        detector=detector,
        verdict=FAIL,
        first_turn=drain_turn(run),
        evidence=tuple(evidence[:16]),
        after_drain=True,
    )


def passed(detector: str, note: str = "") -> Verdict:
    return Verdict(detector=detector, verdict=PASS, first_turn=None, evidence=(), note=note)


def skipped(detector: str, note: str) -> Verdict:
    return Verdict(detector=detector, verdict=SKIPPED, first_turn=None, evidence=(), note=note)


def new_findings(run: RunRecord, probe: ProbeReport) -> tuple[Finding, ...]:
    """The findings of ``probe`` that are the run's doing.

    One engine may serve several runs (kvwatch's server serves a profile's
    concurrencies, vLLM the whole gate): what its probe before the load (the
    run's ``baseline``) already carried was left by an earlier run, which
    answers for it, so a later run is judged on what it added. A finding is
    the same finding when its ``identity`` is (kind, group, pages, and its
    ``key``: an audit's rule and the requests it names). An engine that had
    not stepped before the run (``inherited`` is False) served no earlier
    run: what it carried from its start is this run's to report."""
    judged = tuple(f for f in probe.findings if f.severity == SEVERE)  # notices: ``notices``
    if not inherited(run) or not run.baseline.findings:
        return judged
    before = {f.identity for f in run.baseline.findings}
    return tuple(f for f in judged if f.identity not in before)


def notices(run: RunRecord) -> tuple[tuple[int, Finding], ...]:
    """Every notice the run's probes carried (``contracts.NOTICE``: a broken invariant
    its engine holds harmless), once each, with the first turn that showed it (the
    check after the drain counts as the turn after the last)."""
    seen: dict[tuple, tuple[int, Finding]] = {}
    probes = [(t.turn, p) for t in run.turns for p in t.probes]
    if run.drained is not None:
        probes.append((len(run.turns), run.drained))
    for turn, probe in probes:
        for f in probe.findings:
            if f.severity == NOTICE and f.identity not in seen:
                seen[f.identity] = (turn, f)
    return tuple(seen.values())


def inherited(run: RunRecord) -> bool:
    """Whether the run's engine served work before it: its baseline probe was taken
    after some engine step, so what it shows may be an earlier run's."""
    return run.baseline is not None and run.baseline.step > 0


def unjudged(run: RunRecord) -> str | None:
    """Why nothing of the run's load could be judged (no turn was recorded), or None.
    A detector that judged nothing says so (skipped); it never passes."""
    if run.turns:
        return None
    why = f": {run.error}" if run.error else ""
    return f"no turn was recorded, so nothing was judged{why}"


def findings_detector(detector: str, kinds: Collection[FindingKind], run: RunRecord) -> Verdict:
    """Fail at the first turn whose probes carry a finding of one of ``kinds`` that the
    run made (``new_findings``)."""
    for turn in run.turns:
        for probe in turn.probes:
            hits = [f for f in new_findings(run, probe) if f.kind in kinds]
            if hits:
                ev = [Evidence(group=f.group, pages=f.pages, detail=f.detail) for f in hits]
                return fail(detector, turn.turn, ev)
    if run.drained is not None:
        hits = [f for f in new_findings(run, run.drained) if f.kind in kinds]
        if hits:
            return fail_after_drain(
                detector,
                run,
                [Evidence(group=f.group, pages=f.pages, detail=f.detail) for f in hits],
            )
    if why := unjudged(run):
        return skipped(detector, why)
    names = ", ".join(sorted(str(k) for k in kinds))
    return passed(detector, f"no {names} findings in {len(run.turns)} turns")
