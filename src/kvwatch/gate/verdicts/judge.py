"""One run judged: its record, the detectors that apply, their verdicts.

``RunResult`` is what the rest of the gate reads about a run (the summary,
JUnit, the console, the report, the published metrics); it keeps the
``RunRecord`` it was judged on in memory, so nothing reads ``record.json``
back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from kvwatch.contracts import Finding
from kvwatch.gate.verdicts.detectors import DetectorSet, RunRecord, Verdict, detector_set
from kvwatch.gate.verdicts.detectors.heap import bytes_per_held_token
from kvwatch.gate.verdicts.detectors.verdict import notices
from kvwatch.gate.verdicts.performance import Performance
from kvwatch.harness.time_spent import TimeSpent


class RunResult(NamedTuple):
    profile: str
    concurrency: int
    turns: int
    requests: int
    errors: int  # requests that ended in an error
    verdicts: Mapping[str, Verdict]
    error: str | None = None  # the run itself broke
    timeline: tuple[tuple[int, float], ...] = ()  # (turn, epoch seconds at its barrier)
    # (turn, traced heap bytes per held token: ``heap.bytes_per_held_token``)
    heap_per_token: tuple[tuple[int, float], ...] = ()
    coverage: Mapping[str, Mapping[str, int]] = {}  # lifecycle transitions taken, per machine
    record: RunRecord | None = None  # what the detectors judged (None: the run never recorded)
    performance: Performance | None = None  # what the answered completions cost their clients
    spent: TimeSpent | None = None  # where the run's time went (``harness/time_spent.py``)
    # (first turn, finding) of each notice the run's probes carried (``verdict.notices``)
    notices: tuple[tuple[int, Finding], ...] = ()

    @property
    def name(self) -> str:
        return f"{self.profile} c={self.concurrency}"

    def failed(self) -> dict[str, Verdict]:
        return {name: v for name, v in self.verdicts.items() if v.failed}

    def errored(self) -> dict[str, Verdict]:
        """Detectors that raised on this run (their evidence is the exception)."""
        return {name: v for name, v in self.verdicts.items() if v.errored}

    def as_dict(self) -> dict:
        out = {
            "profile": self.profile,
            "concurrency": self.concurrency,
            "turns": self.turns,
            "requests": self.requests,
            "errors": self.errors,
            "detectors": {name: v.as_dict() for name, v in self.verdicts.items()},
            "timeline": [{"turn": t, "at": at} for t, at in self.timeline],
        }
        if self.heap_per_token:
            points = [{"turn": t, "value": round(v, 3)} for t, v in self.heap_per_token]
            out["heap_bytes_per_held_token"] = points
            out["heap_bytes_per_context_token"] = points  # its old name, the same series
        if self.coverage:
            out["coverage"] = {m: dict(edges) for m, edges in self.coverage.items()}
        if self.performance is not None:
            out["performance"] = self.performance.as_dict()
        if self.spent is not None:
            out["time"] = self.spent.to_json()
        if self.notices:
            out["notices"] = [{"turn": t, **f.to_json()} for t, f in self.notices]
        if self.error:
            out["error"] = self.error
        return out

    @classmethod
    def from_json(cls, data: dict, record: RunRecord | None = None) -> RunResult:
        """Back from ``as_dict`` (a run of summary.json), with its record if it has one."""
        heap = data.get("heap_bytes_per_held_token", data.get("heap_bytes_per_context_token", ()))
        return cls(
            profile=data["profile"],
            concurrency=data["concurrency"],
            turns=data["turns"],
            requests=data["requests"],
            errors=data["errors"],
            verdicts={
                name: Verdict.from_json(name, v) for name, v in data.get("detectors", {}).items()
            },
            error=data.get("error"),
            timeline=tuple((p["turn"], p["at"]) for p in data.get("timeline", ())),
            heap_per_token=tuple((p["turn"], p["value"]) for p in heap),
            coverage=data.get("coverage", {}),
            record=record,
            performance=Performance.from_json(data.get("performance")),
            spent=TimeSpent.from_json(data.get("time")),
            notices=tuple((n["turn"], Finding.from_json(n)) for n in data.get("notices", ())),
        )


def judge(
    profile: str,
    concurrency: int,
    record: RunRecord,
    *,
    requests: int = 0,
    errors: int = 0,
    detectors: DetectorSet | None = None,
) -> RunResult:
    """Run the detectors over one recorded run (every detector unless ``detectors``
    says which). A run that broke part way is
    judged on what it recorded (a finding stands; a detector that needs the
    whole run says it was skipped); a run with nothing recorded is ``broken``."""
    verdicts = (detectors or detector_set()).judge(record)
    timeline = tuple((t.turn, t.at) for t in record.turns if t.at is not None)
    heap = tuple(
        (t.turn, ratio) for t in record.turns if (ratio := bytes_per_held_token(t)) is not None
    )
    return RunResult(
        profile=profile,
        concurrency=concurrency,
        turns=len(record.turns),
        requests=requests,
        errors=errors,
        verdicts=verdicts,
        error=record.error,
        timeline=timeline,
        heap_per_token=heap,
        coverage=record.coverage,
        record=record,
        performance=Performance.of(record.timings) if record.timings is not None else None,
        spent=record.spent,
        notices=notices(record),
    )


def broken(profile: str, concurrency: int, turns: int, error: str) -> RunResult:
    """A run that never produced a record to judge."""
    return RunResult(
        profile=profile,
        concurrency=concurrency,
        turns=turns,
        requests=0,
        errors=0,
        verdicts={},
        error=error,
    )
