"""The gate's verdict over every run, as one typed value every output reads.

``summarize`` turns the judged runs into a ``GateSummary``; ``summary.json``
(``to_json``), the JUnit file, ``gate.prom``, the Grafana annotations, the
report and the console all read that object, and each is written once. The
JSON shape follows docs/contracts.md, which CI scripts read::

    {"verdict": "pass|fail|error", "faults": [...], "target": "kvwatch",
     "detectors": {"allocator": "pass|fail|error|skipped", ...},
     "runs": [{"profile", "concurrency", "turns", "requests", "errors",
               "detectors": {"allocator": {"verdict", "first_turn", "evidence"}, ...},
               "timeline": [{"turn", "at"}], "heap_bytes_per_held_token": [{"turn", "value"}]}]}

A soak (``kvwatch gate --soak``) is one run (profile ``soak``, its probes as
turns) and adds ``"soak"``: its figures and ``checks`` (``soak_report.py``).

Verdict and exit code: ``fail`` (exit 1) when a detector failed, or with
``--strict`` when a run carried a notice (``"strict": true`` then); else
``error`` (exit 3) when a run broke, a detector raised, or nothing ran;
else ``pass`` (exit 0). Exit 2, a usage error, is the CLI's to give.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvwatch.gate.verdicts.detectors import ERROR, FAIL, IDS, PASS, SKIPPED
from kvwatch.gate.verdicts.judge import RunResult
from kvwatch.harness.run_record import RunRecord
from kvwatch.instrumentation.coverage import coverage, merge

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_ERROR = 0, 1, 2, 3


@dataclass(frozen=True, kw_only=True)
class GateSummary:
    verdict: str  # pass, fail or error
    faults: tuple[str, ...]
    detectors: Mapping[str, str]  # each detector's verdict over every run
    runs: tuple[RunResult, ...]
    target: str | None = None  # what was under test: kvwatch, http, vllm, ...
    coverage: Mapping | None = None  # lifecycle coverage, in total and per profile
    elapsed_s: float | None = None
    interrupted: bool = False
    published: Mapping[str, str] | None = None  # where the verdict went: textfile, pushgateway
    soak: Mapping | None = field(default=None, compare=False)  # a soak's figures and checks
    strict: bool = False  # --strict: a notice fails the gate

    @property
    def exit_code(self) -> int:
        return {PASS: EXIT_PASS, FAIL: EXIT_FAIL}.get(self.verdict, EXIT_ERROR)

    def why(self) -> str:
        """ " with --strict: N notices" where notices alone failed the gate, else ""."""
        if self.verdict != FAIL or not self.strict or FAIL in self.detectors.values():
            return ""
        return f" with --strict: {sum(len(r.notices) for r in self.runs)} notices"

    def failures(self) -> list[tuple[RunResult, str]]:
        """Every (run, detector) that failed or raised, in run order."""
        return [
            (run, name)
            for run in self.runs
            for name, v in run.verdicts.items()
            if v.verdict in (FAIL, ERROR)
        ]

    def to_json(self) -> dict:
        out: dict = {
            "verdict": self.verdict,
            "faults": list(self.faults),
            "detectors": dict(self.detectors),
            "runs": [r.as_dict() for r in self.runs],
        }
        if self.target is not None:
            out["target"] = self.target
        if self.coverage:
            out["coverage"] = self.coverage
        if self.elapsed_s is not None:
            out["elapsed_s"] = self.elapsed_s
        if self.published is not None:
            out["published"] = dict(self.published)
        if self.interrupted:
            out["interrupted"] = True
        if self.soak is not None:
            out["soak"] = self.soak
        if self.strict:
            out["strict"] = True
        return out

    @classmethod
    def from_json(
        cls, data: dict, records: Mapping[tuple[str, int], RunRecord] | None = None
    ) -> GateSummary:
        """Back from summary.json; ``records`` by (profile, concurrency), where kept."""
        records = records or {}
        return cls(
            verdict=data["verdict"],
            faults=tuple(data.get("faults", ())),
            detectors=dict(data.get("detectors", {})),
            runs=tuple(
                RunResult.from_json(r, records.get((r["profile"], r["concurrency"])))
                for r in data.get("runs", ())
            ),
            target=data.get("target"),
            coverage=data.get("coverage"),
            elapsed_s=data.get("elapsed_s"),
            interrupted=data.get("interrupted", False),
            published=data.get("published"),
            soak=data.get("soak"),
            strict=data.get("strict", False),
        )


def overall(verdicts: Iterable[str]) -> str:
    """One detector over every run: a failure stands, then a crash, then a pass."""
    seen = set(verdicts)
    for verdict in (FAIL, ERROR, PASS):
        if verdict in seen:
            return verdict
    return SKIPPED


def summarize(
    runs: Sequence[RunResult],
    faults: Iterable[str] = (),
    *,
    target: str | None = None,
    interrupted: bool = False,
    strict: bool = False,
) -> GateSummary:
    """The summary of ``runs``. Interrupted, an unfinished gate is no pass: its
    verdict is ``fail`` when a finished run failed, else ``error``. ``strict``:
    a notice a run carried fails the gate as a failed detector does."""
    detectors = {
        name: overall(r.verdicts[name].verdict for r in runs if name in r.verdicts)
        for name in IDS
        if any(name in r.verdicts for r in runs)
    }
    # A detector that failed is the finding, even where a fault then broke the run.
    if FAIL in detectors.values() or (strict and any(r.notices for r in runs)):
        verdict = FAIL
    elif ERROR in detectors.values() or any(r.error for r in runs) or not runs or interrupted:
        verdict = ERROR
    else:
        verdict = PASS
    return GateSummary(
        verdict=verdict,
        faults=tuple(sorted(faults)),
        detectors=detectors,
        runs=tuple(runs),
        target=target,
        coverage=coverage_summary(runs) if any(r.coverage for r in runs) else None,
        interrupted=interrupted,
        strict=strict,
    )


def coverage_summary(runs: Sequence[RunResult]) -> dict:
    """Lifecycle coverage in total and per profile: per machine, transitions taken
    (with counts), never taken, and seen but not in the machine."""
    profiles = sorted({r.profile for r in runs})
    return {
        "total": coverage(merge(*(r.coverage for r in runs))),
        "profiles": {
            p: coverage(merge(*(r.coverage for r in runs if r.profile == p))) for p in profiles
        },
    }


NEVER_SHOWN = 3  # never-taken edges the console line names; summary.json lists all


def coverage_line(summary: GateSummary) -> str | None:
    """One short line for the console: edges taken of those listed, over every
    machine; the first few never taken and how many more; how many were seen
    outside the machines. The full lists stay in summary.json."""
    total = (summary.coverage or {}).get("total")
    if not total:
        return None
    listed = sum(c["total"] for c in total.values())
    never = [f"{m}: {t}" for m, c in total.items() for t in c["never"]]
    # "taken" holds the edges listed apart (Machine.also) too: counted on their own
    apart = sum(len(c["taken"]) for c in total.values()) - (listed - len(never))
    unlisted = sum(len(c["unlisted"]) for c in total.values())
    line = f"coverage: {listed - len(never)} of {listed} transitions taken in {len(total)} machines"
    if apart > 0:
        line += f" (and {apart} listed apart)"
    if never:
        more = len(never) - NEVER_SHOWN
        line += f"; never taken: {', '.join(never[:NEVER_SHOWN])}"
        line += f" and {more} more (summary.json)" if more > 0 else ""
    else:
        line += "; every transition taken"
    return line + (f"; {unlisted} seen outside the machines" if unlisted else "")


def write_summary(summary: GateSummary, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "summary.json"
    path.write_text(json.dumps(summary.to_json(), indent=2) + "\n")
    return path


def read_summary(out: Path) -> GateSummary:
    """A gate's summary back from ``out``: summary.json and each run's record.json."""
    data = json.loads((out / "summary.json").read_text())
    records = {}
    for run in data.get("runs", ()):
        path = out / "runs" / f"{run['profile']}-c{run['concurrency']}" / "record.json"
        if path.exists():
            records[(run["profile"], run["concurrency"])] = RunRecord.from_json(
                json.loads(path.read_text())
            )
    return GateSummary.from_json(data, records)
