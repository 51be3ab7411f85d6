"""Gate verdicts: detector results per run -> summary.json, JUnit XML and an exit code.

The shapes follow docs/contracts.md, which CI scripts read::

    {"verdict": "pass|fail|error", "faults": [...],
     "detectors": {"allocator": "pass|fail|skipped", ...},
     "runs": [{"profile", "concurrency", "turns", "requests", "errors",
               "detectors": {"allocator": {"verdict", "first_turn", "evidence"}, ...},
               "timeline": [{"turn", "at"}], "heap_bytes_per_context_token": [{"turn", "value"}]}]}

``timeline`` (when each barrier was reached, epoch seconds) places findings on
a dashboard; the heap series is there for runs that tracked the heap. A soak
(``kvwatch gate --soak``) is one run (profile ``soak``, its probes as turns)
and adds ``"soak"``: its figures and ``checks`` (see ``loadtests/soak_report.py``).

Exit codes: 0 every detector passed, 1 a detector failed, 3 the run broke
and no detector failed (2, a usage error, is the CLI's to give).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from kvwatch.gate.detectors import (
    FAIL,
    IDS,
    PASS,
    SKIPPED,
    RunRecord,
    Verdict,
    run_detectors,
)
from kvwatch.telemetry.coverage import coverage, merge

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_ERROR = 0, 1, 2, 3


class RunResult(NamedTuple):
    profile: str
    concurrency: int
    turns: int
    requests: int
    errors: int  # requests that ended in an error
    verdicts: Mapping[str, Verdict]
    error: str | None = None  # the run itself broke
    timeline: tuple[tuple[int, float], ...] = ()  # (turn, epoch seconds at its barrier)
    heap_per_token: tuple[tuple[int, float], ...] = ()  # (turn, traced bytes / context token)
    coverage: Mapping[str, Mapping[str, int]] = {}  # lifecycle transitions taken, per machine

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
            out["heap_bytes_per_context_token"] = [
                {"turn": t, "value": round(v, 3)} for t, v in self.heap_per_token
            ]
        if self.coverage:
            out["coverage"] = {m: dict(edges) for m, edges in self.coverage.items()}
        if self.error:
            out["error"] = self.error
        return out


def judge(
    profile: str,
    concurrency: int,
    record: RunRecord,
    *,
    requests: int = 0,
    errors: int = 0,
    detectors: Sequence[str] = IDS,
) -> RunResult:
    """Run the detectors over one recorded run."""
    verdicts = run_detectors(record, tuple(detectors))
    timeline = tuple((t.turn, t.at) for t in record.turns if t.at is not None)
    heap = tuple(
        (t.turn, t.heap.traced_bytes / t.context_tokens)
        for t in record.turns
        if t.heap is not None and t.context_tokens > 0
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
    )


def overall(verdicts: Iterable[str]) -> str:
    seen = set(verdicts)
    if FAIL in seen:
        return FAIL
    return PASS if PASS in seen else SKIPPED


def summarize(runs: Sequence[RunResult], faults: Iterable[str] = ()) -> dict:
    detectors = {
        name: overall(r.verdicts[name].verdict for r in runs if name in r.verdicts)
        for name in IDS
        if any(name in r.verdicts for r in runs)
    }
    # A detector that failed is the finding, even where a fault then broke the run.
    if FAIL in detectors.values():
        verdict = FAIL
    elif any(r.error for r in runs) or not runs:
        verdict = "error"
    else:
        verdict = PASS
    summary = {
        "verdict": verdict,
        "faults": sorted(faults),
        "detectors": detectors,
        "runs": [r.as_dict() for r in runs],
    }
    if any(r.coverage for r in runs):
        summary["coverage"] = coverage_summary(runs)
    return summary


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


def coverage_line(summary: Mapping) -> str | None:
    """One line for the console: taken of total per machine, and what was never taken."""
    total = summary.get("coverage", {}).get("total")
    if not total:
        return None
    parts = [f"{m} {len(c['taken'])}/{c['total']}" for m, c in total.items()]
    never = [f"{m}: {t}" for m, c in total.items() for t in c["never"]]
    tail = f"; never taken: {', '.join(never)}" if never else "; every transition taken"
    return f"lifecycle transitions taken: {', '.join(parts)}{tail}"


def exit_code(summary: Mapping) -> int:
    return {PASS: EXIT_PASS, FAIL: EXIT_FAIL}.get(summary["verdict"], EXIT_ERROR)


def junit_xml(summary: Mapping) -> str:
    """One test case per run and detector; a failure carries the evidence."""
    suite = ET.Element("testsuite", name="kvwatch-gate")
    counts = {"tests": 0, "failures": 0, "skipped": 0, "errors": 0}
    for run in summary["runs"]:
        classname = f"kvwatch.{run['profile']}.c{run['concurrency']}"
        if run.get("error"):
            case = ET.SubElement(suite, "testcase", classname=classname, name="run")
            ET.SubElement(case, "error", message=run["error"])
            counts["tests"] += 1
            counts["errors"] += 1
        for name, d in run["detectors"].items():
            case = ET.SubElement(suite, "testcase", classname=classname, name=name)
            counts["tests"] += 1
            if d["verdict"] == FAIL:
                counts["failures"] += 1
                node = ET.SubElement(
                    case, "failure", message=f"first failing turn {d['first_turn']}"
                )
                node.text = "\n".join(
                    [d["evidence"], *(e["detail"] for e in d.get("details", [])[1:])]
                )
            elif d["verdict"] == SKIPPED:
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=d["evidence"])
    for key, value in counts.items():
        suite.set(key, str(value))
    return ET.tostring(suite, encoding="unicode", xml_declaration=True)


def write(summary: Mapping, out: Path, junit: Path | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if junit is not None:
        junit.parent.mkdir(parents=True, exist_ok=True)
        junit.write_text(junit_xml(summary))
