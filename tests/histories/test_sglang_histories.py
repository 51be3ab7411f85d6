"""The history tier on SGLang's own scheduler (the release's wheel, downloaded at test time
and skipped, saying why, when PyPI cannot be reached): no finding where nothing is wrong,
and the crash docs/real-bugs.json's sglang-same-iteration-session-turns row describes,
found from a generated history alone and shrunk to the operations that make it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from paths import REPO
from sglang_drive import load

from kvwatch.histories.checks import RAISED
from kvwatch.histories.generate import Plan, generate
from kvwatch.histories.hunt import hunt, run_history
from kvwatch.histories.ops import TURN
from kvwatch.targets.sglang.histories import SglangHistoryTarget

pytestmark = pytest.mark.e2e
NEWEST = "0.5.23"
PLAN = Plan(turns=4, ops_per_turn=12)


def _target(setup: str) -> SglangHistoryTarget:
    load(NEWEST)  # skips when the wheel cannot be had
    return SglangHistoryTarget(version=NEWEST, setup=setup)


def test_the_radix_cache_alone_passes_every_check_it_can_run():
    runs = hunt(_target("plain"), [0, 1, 2], PLAN)
    for run in runs:
        assert not run.verdict.findings, (run.seed, run.verdict.findings)
        skipped = {check for check, _ in run.verdict.skipped}
        # no reference; hits are not read; lock refs are taken for no named request
        assert skipped == {"equivalence", "content", "references"}


def test_two_turns_of_a_new_streaming_session_at_once_crash_the_scheduler(tmp_path):
    target = _target("sessions-retract")
    with target.opened():
        for seed in range(8):
            _, verdict = run_history(target, generate(target.shape, seed, PLAN))
            if "in take" in (verdict.primary or ""):
                break
        else:
            raise AssertionError("no history of seeds 0-7 crashed in StreamingSession.take")
    (run,) = hunt(target, [seed], PLAN, tmp_path, shrink_budget=100)
    assert run.shrunk is not None and run.shrunk_verdict is not None
    (crash,) = [f for f in run.shrunk_verdict.findings if f.check == RAISED]
    assert "already has a slot" in crash.detail and "streaming_session.py" in crash.detail
    turns = [op for op in run.shrunk.ops if op.kind == TURN]
    assert len(run.shrunk.ops) <= 8 < len(generate(target.shape, seed, PLAN).ops)
    assert len([op for op in turns if op.session == turns[0].session]) >= 2


def test_the_rows_reproduction_shows_it_on_the_newest_release():
    load(NEWEST)
    script = REPO / "docs" / "real-bugs" / "sglang_same_iteration_session_turns.py"
    done = subprocess.run(
        [sys.executable, str(script), NEWEST], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "AssertionError: session_id='s' already has a slot" in done.stdout


@pytest.mark.parametrize(
    "row,buggy,fixed,how",
    [
        ("sglang-pr-12693", "0.5.4.post3", "0.5.5", "aborted-in-queue"),
        ("sglang-pr-21404", "0.5.9", "0.5.10", "timed-out"),
    ],
)
def test_a_fixed_corpus_row_is_found_on_its_buggy_release_and_not_on_its_fix(
    row, buggy, fixed, how
):
    """docs/real-bugs.json's two mamba-slot rows: a request that leaves the queue (its
    client's abort; its waiting timeout) keeps its mamba slot on the release with the
    bug. Generated histories alone find it there, and the same seeds pass on the fix."""
    seeds = range(12)
    load(buggy)
    load(fixed)
    with_bug = hunt(SglangHistoryTarget(version=buggy, setup="mamba"), seeds, PLAN)
    with_fix = hunt(SglangHistoryTarget(version=fixed, setup="mamba"), seeds, PLAN)
    found = [
        f.detail
        for run in with_bug
        for f in run.verdict.findings
        if "sglang.mamba" in f.detail and how in f.detail
    ]
    assert found, (row, [run.verdict.findings for run in with_bug])
    assert all(not run.verdict.findings for run in with_fix), [r.verdict.findings for r in with_fix]


def test_the_index_check_reads_sglangs_own_kv_events_and_fails_where_a_removal_goes_untold():
    """The release's KV event recorder, switched on: its events agree with its tree on
    clean histories, and a recorder that drops every removal (a planted bug, in this
    test only) fails the index check at the step the tree lost the blocks."""
    target = _target("plain")
    history = generate(target.shape, 0, PLAN)
    with target.opened():
        played, verdict = run_history(target, history)
        assert "index" not in verdict.failed
        assert any(type(e).__name__ == "Stored" for e in played.cache_log)
        assert any(type(e).__name__ == "Removed" for e in played.cache_log)

        class Untold(SglangHistoryTarget):
            def make_watch(self, loop):
                watch = super().make_watch(loop)
                watch.recorder.record_remove = lambda *a, **k: None
                return watch

        broken = Untold(version=NEWEST, setup="plain")
        _, failed = run_history(broken, history)
    (finding,) = [f for f in failed.findings if f.check == "index"]
    assert finding.key == "disagrees" and "the index holds 0 key(s) never told" in finding.detail
