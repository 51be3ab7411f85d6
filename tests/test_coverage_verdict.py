"""The ``coverage`` verdict: a whole default gate must take every owed transition.

It fails the gate on a transition the load drives and the engine never took
(here ``verifying -> aborted``, which a dropped mid-step abort takes away), and
passes the same gate with it taken; a gate that owes nothing is not judged.
The e2e gates of ``test_gate_runs.py`` show a clean default gate passing it.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from test_gate_core import verdicts

from kvwatch.gate.detectors import owed_transitions as coverage_check
from kvwatch.gate.judge import RunResult
from kvwatch.gate.junit import junit_xml
from kvwatch.gate.options import GateOptions
from kvwatch.gate.pipeline import _owes_coverage
from kvwatch.gate.profiles import PROFILES
from kvwatch.gate.report_text import evidence
from kvwatch.gate.summary import EXIT_FAIL, EXIT_PASS, GateSummary, coverage_line, summarize
from kvwatch.targets.kvwatch_target import KvwatchTarget
from kvwatch.telemetry.coverage import MACHINES

LOST = ("request", "verifying -> aborted")


def every_transition(but: tuple[str, str] | None = None) -> dict[str, dict[str, int]]:
    taken = {name: dict.fromkeys(m.transitions, 1) for name, m in MACHINES.items()}
    if but is not None:
        del taken[but[0]][but[1]]
    return taken


def runs(taken: dict, *, error: str | None = None) -> list[RunResult]:
    """Two runs that took ``taken`` between them (each half of the machines)."""
    names = sorted(taken)
    halves = (names[::2], names[1::2])
    return [
        RunResult(
            profile=f"p{i}",
            concurrency=2,
            turns=6,
            requests=40,
            errors=0,
            verdicts=verdicts(),
            coverage={m: taken[m] for m in half},
            error=error if i == 1 else None,
        )
        for i, half in enumerate(halves)
    ]


def test_a_gate_that_took_every_owed_transition_passes_coverage():
    summary = summarize(runs(every_transition()), owes_coverage=True)
    assert summary.detectors["coverage"] == "pass" and summary.exit_code == EXIT_PASS
    assert summary.coverage["owed"] is True
    assert not coverage_line(summary).startswith("FAIL")
    case = ET.fromstring(junit_xml(summary)).find("testcase[@classname='kvwatch.gate']")
    assert case is not None and case.get("name") == "coverage" and len(case) == 0


def test_an_owed_transition_never_taken_fails_the_gate_and_says_which():
    summary = summarize(runs(every_transition(but=LOST)), owes_coverage=True)
    assert summary.detectors["coverage"] == "fail" and summary.exit_code == EXIT_FAIL
    line = coverage_line(summary)
    assert line.startswith("FAIL coverage: ") and "request: verifying -> aborted" in line
    failure = ET.fromstring(junit_xml(summary)).find("testcase[@classname='kvwatch.gate']/failure")
    assert failure is not None and "never taken: request: verifying -> aborted" in failure.text
    assert "request: verifying -&gt; aborted" in evidence(summary)
    # summary.json carries what it takes to judge it again
    back = GateSummary.from_json(summary.to_json())
    assert back.detectors["coverage"] == "fail" and coverage_check.verdict_of(back.coverage).failed


def test_a_gate_that_owes_nothing_is_not_judged_on_coverage():
    """Chosen profiles, another engine setting, another target: the gap is reported,
    never judged."""
    summary = summarize(runs(every_transition(but=LOST)))
    assert "coverage" not in summary.detectors and summary.exit_code == EXIT_PASS
    assert summary.coverage["owed"] is False and "never taken" in coverage_line(summary)
    assert "kvwatch.gate" not in junit_xml(summary)


def test_a_broken_run_is_its_own_verdict_not_a_coverage_failure():
    summary = summarize(
        runs(every_transition(but=LOST), error="the server died"), owes_coverage=True
    )
    assert "coverage" not in summary.detectors and summary.verdict == "error"


def test_kvwatch_owes_coverage_only_for_its_whole_default_gate(tmp_path):
    target = KvwatchTarget(tmp_path)
    every = tuple(PROFILES.values())
    assert target.owes_coverage(every)
    assert not target.owes_coverage(every[:-1])
    assert not KvwatchTarget(tmp_path, engine_sets=("cache.full_kv.page_size=8",)).owes_coverage(
        every
    )
    opts = GateOptions(out=tmp_path)
    assert _owes_coverage(opts, target, every)
    fewer = GateOptions(out=tmp_path, turns=min(p.turns for p in every) - 1)
    assert not _owes_coverage(fewer, target, every)
