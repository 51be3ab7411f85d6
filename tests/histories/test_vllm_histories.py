"""The history tier on vLLM's own scheduler, played in vLLM's Python: every setup passes
clean on the newest release at three seeds, and the fixed corpus rows are found from
generated histories on the release with the bug and not on its fix. ``make test-vllm`` builds the venv and
unpacks the releases; without them these skip."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
from paths import REPO

from kvwatch.histories.checks import AUDIT, CONTENT, EQUIVALENCE, INDEX, REFERENCES
from kvwatch.histories.generate import Plan, generate
from kvwatch.histories.hunt import hunt, replay_file, run_history, save_history
from kvwatch.targets.vllm.histories import SETUPS, Unavailable, VllmHistoryTarget

PYTHON = os.environ.get("KVWATCH_VLLM_PYTHON")
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.e2e,
    pytest.mark.skipif(not PYTHON, reason="needs vLLM's venv: run `make test-vllm`"),
]
PLAN = Plan(turns=4, ops_per_turn=12)
DOCS = REPO / "docs"
LINE = re.compile(r"^(\S+): (.+)$", re.M)  # an exported replay's "rid: how it ended" lines


def _target(version: str, setup: str) -> VllmHistoryTarget:
    try:
        return VllmHistoryTarget(version=version, setup=setup, python=PYTHON)
    except Unavailable as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("setup", list(SETUPS))
def test_every_setup_of_the_newest_release_passes_clean_at_three_seeds(setup):
    target = _target("0.33.0", setup)
    beside, turns = set(), 0
    with target.opened():
        for seed in (0, 1, 2):
            played, verdict = run_history(target, generate(target.shape, seed, PLAN))
            assert not verdict.findings, (seed, verdict.findings)
            assert len(played.ended) == len(played.sent) > 5  # sessions' turns: refusals
            turns += sum(1 for s in played.sent.values() if s.session)
            beside |= {s.beside for s in played.sent.values() if s.session} - {""}
            assert {"queued", "prefilling", "decoding"} <= {
                s for trail in played.stages.values() for s in trail
            }
            assert any(e.hit for e in played.ended.values())  # hits read, and some served
            assert played.aborted_in  # clients left in some stage
            skipped = {check for check, _ in verdict.skipped}
            assert skipped == {INDEX, REFERENCES, EQUIVALENCE}  # content and audit ran
            assert CONTENT not in skipped and AUDIT not in skipped
    if SETUPS[setup].sessions:  # streaming input: turns ran, some queued behind a live one
        assert turns > 10 and beside, (turns, beside)
    else:
        assert turns == 0


def test_preemption_is_reached_under_the_small_pool():
    target = _target("0.33.0", "plain")
    with target.opened():
        stages = set()
        for seed in range(8):
            played, _ = run_history(target, generate(target.shape, seed, PLAN))
            stages |= {s for trail in played.stages.values() for s in trail}
    assert "retracted" in stages


def test_a_prompt_that_overfills_the_context_is_refused_and_one_that_fills_it_runs():
    target = _target("0.33.0", "plain")
    ctx = target.shape.context
    from kvwatch.histories.ops import SUBMIT, History, Op

    ops = (
        Op(turn=0, at=0, kind=SUBMIT, rid="fits", tokens=tuple(range(40, 40 + ctx - 4)), max_new=4),
        Op(turn=0, at=0, kind=SUBMIT, rid="over", tokens=tuple(range(40, 40 + ctx - 3)), max_new=4),
    )
    with target.opened():
        played, verdict = run_history(target, History(engine="vllm", seed=0, ops=ops))
    assert [op.rid for op, _ in played.refused] == ["over"]
    assert "maximum context length" in played.refused[0][1]
    assert played.ended["fits"].status == "finished" and len(played.ended["fits"].output) == 4
    assert not verdict.findings


@pytest.mark.parametrize(
    "setup,buggy,fixed,seed,words",
    [
        # issue 49377: a session's next chunk keeps the hashes of the token it replaced
        ("streaming", "0.31.0", "0.32.0", 0, "request-hash-stale"),
        # PR 49206: the running loop preempts and skips the request after its victim
        ("priority", "0.27.1", "0.28.0", 56, "running-skipped"),
        # PR 44490: a full-attention group's new_block_ids is never cleared
        ("plain", "0.25.1", "0.26.0", 0, "new_block_ids"),
    ],
)
def test_a_fixed_row_is_found_on_its_buggy_release_and_not_on_its_fix(
    setup, buggy, fixed, seed, words, tmp_path
):
    with_bug, with_fix = _target(buggy, setup), _target(fixed, setup)
    (run,) = hunt(with_bug, [seed], PLAN, tmp_path, shrink_budget=80)
    assert AUDIT in run.verdict.failed
    assert any(words in f.detail for f in run.verdict.findings), run.verdict.findings
    assert run.saved is not None and run.shrunk is not None
    saved = json.loads(run.saved.read_text())
    assert saved["target"] == {"engine": "vllm", "version": buggy, "setup": setup}
    _, _, replayed = replay_file(run.saved)
    assert any(words in f.detail for f in replayed.findings)
    with with_fix.opened():
        for history in (generate(with_fix.shape, seed, PLAN), run.shrunk):
            _, verdict = run_history(with_fix, history)
            assert not verdict.findings, verdict.findings


def _run_alone(target: VllmHistoryTarget, path, tmp_path) -> subprocess.CompletedProcess:
    """The saved history at ``path`` exported, and run in vLLM's Python with kvwatch
    unimportable."""
    from kvwatch.targets.vllm.export import export

    out = tmp_path / "replay.py"
    export(path, out)
    blocked = f"import sys, runpy; sys.modules['kvwatch'] = None; runpy.run_path({str(out)!r}, run_name='__main__')"
    env = {**os.environ, **target.release.env()}
    return subprocess.run(
        [target.release.python, "-P", "-c", blocked],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )  # fmt: skip


def test_the_saved_deadlock_stalls_vllm_alone_in_its_exported_replay(tmp_path):
    path = DOCS / "vllm-history-hunt" / "vllm-streaming-session-deadlock.json"
    target = _target("0.33.0", "streaming")
    done = _run_alone(target, path, tmp_path)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "STALL at step" in done.stdout and "0 running" in done.stdout


def test_an_exported_replay_ends_each_request_as_kvwatchs_player_did(tmp_path):
    target = _target("0.33.0", "streaming")
    history = generate(target.shape, 0, PLAN)
    with target.opened():
        played, verdict = run_history(target, history)
    assert not verdict.findings
    path = tmp_path / "h.json"
    save_history(path, target, 0, history, verdict)
    done = _run_alone(target, path, tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    alone = dict(LINE.findall(done.stdout))
    refused = {op.rid for op, _ in played.refused}
    assert {rid for rid, how in alone.items() if how.startswith("refused")} == refused
    for rid, end in played.ended.items():
        how = alone[rid]
        if end.status == "finished":
            assert how == f"length, {len(end.output)} tokens", (rid, how, end)
        else:
            assert how.startswith(end.status), (rid, how, end)
