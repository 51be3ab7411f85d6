"""The history tier on kvwatch's own engine: every checker fails on a planted bug and
passes the clean engine, on the same histories; failures shrink to files that replay."""

from __future__ import annotations

import json

import pytest

from kvwatch.gate.verdicts.catches import HISTORY_CATCHES
from kvwatch.histories.checks import AUDIT, CHECKS, DRAINED, EQUIVALENCE
from kvwatch.histories.generate import Plan, generate
from kvwatch.histories.hunt import hunt, replay_file, run_history
from kvwatch.targets.kvwatch.histories import KvwatchHistoryTarget

pytestmark = pytest.mark.slow  # tens of seconds: histories played and shrunk
PLAN = Plan(turns=4, ops_per_turn=12)
SEEDS = range(8)


def _first_failing(fault: str, check: str):
    """The first seed whose history fails ``check`` with ``fault`` on, and that history."""
    target = KvwatchHistoryTarget(faults=[fault])
    for seed in SEEDS:
        history = generate(target.shape, seed, PLAN)
        _, verdict = run_history(target, history)
        if check in verdict.failed:
            return history, verdict
    raise AssertionError(f"no history of seeds {SEEDS} failed {check} with {fault}")


def test_the_clean_engine_passes_every_check_at_three_seeds():
    target = KvwatchHistoryTarget()
    for seed in (0, 1, 2):
        played, verdict = run_history(target, generate(target.shape, seed, PLAN))
        assert not verdict.findings, (seed, verdict.findings)
        assert not verdict.skipped  # every check ran: inputs read, a cache-off reference
        assert len(played.ended) == len(played.sent) > 10
        assert any(e.hit for e in played.ended.values())  # the cache served hits


@pytest.mark.parametrize("fault,check", [(f, c.detector) for f, c in HISTORY_CATCHES.items()])
def test_each_history_fault_fails_its_check_and_the_same_history_passes_without_it(
    fault, check, tmp_path
):
    assert check in CHECKS
    history, _ = _first_failing(fault, check)
    _, clean = run_history(KvwatchHistoryTarget(), history)
    assert not clean.findings, clean.findings
    runs = hunt(KvwatchHistoryTarget(faults=[fault]), [history.seed], PLAN, tmp_path)
    (run,) = runs
    assert run.saved is not None and run.shrunk is not None
    assert len(run.shrunk.ops) < len(history.ops)
    saved = json.loads(run.saved.read_text())
    assert check in saved["failed"] and saved["target"]["faults"] == [fault]
    again, _, replayed = replay_file(run.saved)
    assert again == run.shrunk and check in replayed.failed
    _, shrunk_clean = run_history(KvwatchHistoryTarget(), run.shrunk)
    assert not shrunk_clean.findings


@pytest.mark.parametrize(
    "fault,check",
    [
        ("root-ref-leak-on-miss", AUDIT),  # a root ref a lookup never gives back
        ("abort-state-buffer-leak", DRAINED),  # state pages an abort leaves behind
        ("prefix-match-first-page-only", EQUIVALENCE),  # another conversation's KV
    ],
)
def test_the_audit_drain_and_equivalence_checks_fail_on_their_bugs_and_pass_without(fault, check):
    history, verdict = _first_failing(fault, check)
    assert any(f.check == check and f.detail for f in verdict.findings)
    _, clean = run_history(KvwatchHistoryTarget(), history)
    assert not clean.findings
