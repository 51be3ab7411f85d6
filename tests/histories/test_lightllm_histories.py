"""The history tier on LightLLM's own infer loop, imported from a checkout in a process of
its own: both setups pass clean on the newest commit at three seeds, reading what each
request found cached; seed 002's LightLLM bug (PR #1348) is found from generated histories
on the commit with the bug and not on its fix; a saved history replays on another checkout.

LightLLM is not on PyPI: ``KVWATCH_LIGHTLLM_SRC`` (a checkout of current main) and
``KVWATCH_LIGHTLLM_REPO`` (a git repository holding both commits of the fix) name it, and
these skip without them. The checks that need no LightLLM (``commit_of`` of an export, the
CLI's refusals) run everywhere."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from hunts.lightllm_histories import FIXED, pr_1348
from kvwatch import cli
from kvwatch.histories.checks import CONTENT, EQUIVALENCE, INDEX, REFERENCES
from kvwatch.histories.generate import generate
from kvwatch.histories.hunt import replay_file, run_history, save_history
from kvwatch.targets.lightllm.checkout_check import COMMIT_FILE, commit_of, export
from kvwatch.targets.lightllm.histories import SETUPS, LightllmHistoryTarget

ROW = FIXED[0]


def needs(variable: str) -> Path:
    value = os.environ.get(variable)
    if not value:
        pytest.skip(f"set {variable} to run LightLLM's own code (its source is not on PyPI)")
    return Path(value)


def git(*args: str, cwd: Path) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_an_export_inside_another_work_tree_names_its_own_commit(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git("init", "-q", cwd=repo)
    (repo / "a.txt").write_text("one\n")
    git("add", "a.txt", cwd=repo)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one", cwd=repo)
    first = git("rev-parse", "HEAD", cwd=repo)
    (repo / "a.txt").write_text("two\n")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "two", cwd=repo)
    # exported into a folder of the repository itself: git would answer its HEAD, not first
    folder = export(repo, first[:8], repo / "exports")
    assert (folder / "a.txt").read_text() == "one\n"
    assert commit_of(folder) == first
    assert commit_of(repo) == git("rev-parse", "HEAD", cwd=repo) != first
    (folder / COMMIT_FILE).unlink()
    assert commit_of(folder) is None  # inside the repository, but not the top of a work tree


def test_lightllm_flags_go_with_the_lightllm_engine(capsys):
    assert cli.main(["histories", "--engine", "vllm", "--lightllm-setup", "linear"]) == 2
    assert "--lightllm-* flags go with --engine lightllm" in capsys.readouterr().err
    assert cli.main(["histories", "--lightllm-src", "/nowhere"]) == 2
    assert "--lightllm-src goes with --engine lightllm" in capsys.readouterr().err
    assert cli.main(["histories", "--engine", "lightllm", "--lightllm-src", "/nowhere"]) == 2
    assert "no such folder" in capsys.readouterr().err


@pytest.mark.e2e
@pytest.mark.parametrize("setup", list(SETUPS))
def test_every_setup_of_the_newest_commit_passes_clean_at_three_seeds(setup):
    target = LightllmHistoryTarget(src=needs("KVWATCH_LIGHTLLM_SRC"), setup=setup)
    stages, hits = set(), 0
    with target.opened():
        for seed in (0, 1, 2):
            played, verdict = run_history(target, generate(target.shape, seed, ROW.row.plan))
            assert not verdict.findings, (seed, verdict.findings)
            assert len(played.ended) + len(played.refused) >= len(played.sent) > 5
            stages |= {stage for trail in played.stages.values() for stage in trail}
            hits += sum(1 for e in played.ended.values() if e.hit)
            skipped = {check for check, _ in verdict.skipped}
            assert skipped == {INDEX, REFERENCES, EQUIVALENCE}, verdict.skipped
            assert CONTENT not in skipped
    assert {"queued", "prefilling", "decoding"} <= stages, stages
    assert hits > 0  # the content check compared some request's cached prefix


@pytest.mark.e2e
def test_pr_1348_is_found_on_the_commit_with_the_bug_and_not_on_its_fix(tmp_path):
    repo = needs("KVWATCH_LIGHTLLM_REPO")
    (setup,) = ROW.row.setups
    buggy = LightllmHistoryTarget(src=export(repo, ROW.buggy, tmp_path), setup=setup)
    fixed = LightllmHistoryTarget(src=export(repo, ROW.fixed, tmp_path), setup=setup)
    histories = [generate(buggy.shape, seed, ROW.row.plan) for seed in range(4)]
    with buggy.opened():
        shown = [(h, run_history(buggy, h)) for h in histories]
    shown = [(h, played) for h, (played, verdict) in shown if pr_1348(played, verdict)]
    assert shown, "no seed of 0-3 shows PR #1348's bug on its commit"
    with fixed.opened():
        for h in histories:
            played, verdict = run_history(fixed, h)
            assert pr_1348(played, verdict) is None, (h.seed, verdict.findings)
            assert not verdict.findings, (h.seed, verdict.findings)
    # the saved history names its checkout; --lightllm-src plays it on another one
    history = shown[0][0]
    saved = tmp_path / "saved.json"
    with buggy.opened():
        save_history(saved, buggy, history.seed, history, run_history(buggy, history)[1])
    assert json.loads(saved.read_text())["target"]["commit"].startswith(ROW.buggy)
    _, played, verdict = replay_file(saved)
    assert pr_1348(played, verdict)
    _, played, verdict = replay_file(saved, src=str(fixed.checkout.path))
    assert not verdict.findings, verdict.findings
