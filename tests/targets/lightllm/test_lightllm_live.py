"""``kvwatch gate --engine lightllm-cache`` on real LightLLM source, as a user runs it.

LightLLM is not on PyPI and CI has no network to GitHub, so these take the
source from the environment and are skipped, saying so, without it:

* ``KVWATCH_LIGHTLLM_SRC``: a LightLLM checkout (current main). Every profile,
  both caches, passes;
* ``KVWATCH_LIGHTLLM_REPO``: a LightLLM git repository (a clone, or a bare
  git dir such as a mirror) holding the two commits of seed 002's fix, PR
  #1348. Each commit is exported (``git archive``) into the test's folder.
  On 3a15cb09 (before) ``--lightllm-cache linear --profile aborts`` fails
  ``allocator`` (a big-page state buffer an aborted chunked prefill took is
  held by no one) and ``tree`` (the root in the eviction set), and the run's
  error names LightLLM's assert ``infer_batch.py:132``; on b0231dea (the fix)
  it passes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvwatch.targets.lightllm.checkout_check import export

pytestmark = pytest.mark.e2e
BEFORE = "3a15cb096120ed554bf78ae2fe95e72fa15104f2"  # #1345, the parent of the fix
AFTER = "b0231dea85d9cd1faac4cbdbd6602dcf3224116c"  # PR #1348, squash-merged
SRC, REPO = "KVWATCH_LIGHTLLM_SRC", "KVWATCH_LIGHTLLM_REPO"


def needs(variable: str) -> Path:
    value = os.environ.get(variable)
    if not value:
        pytest.skip(f"set {variable} to run LightLLM's own code (its source is not on PyPI)")
    return Path(value)


def exported(repo: Path, commit: str, where: Path) -> Path:
    """``commit``'s tree from ``repo`` (a clone or a bare git dir) under ``where``."""
    try:
        return export(repo, commit, where)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"{repo} does not hold LightLLM commit {commit}: {exc.stderr!s:.200}")


def gate(src: Path, out: Path, *flags: str) -> tuple[int, dict, str]:
    cmd = [sys.executable, "-m", "kvwatch", "gate", "--engine", "lightllm-cache"]
    cmd += ["--lightllm-src", str(src), "--out", str(out), "--no-report", *flags]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    summary = json.loads((out / "summary.json").read_text())
    return done.returncode, summary, done.stdout + done.stderr


@pytest.mark.parametrize("cache", ["radix", "linear"])
def test_every_profile_passes_on_lightllm_main(tmp_path, cache):
    src = needs(SRC)
    code, summary, output = gate(src, tmp_path / cache, "--lightllm-cache", cache, "-c", "2")
    assert code == 0, output
    assert summary["target"] == "lightllm-cache"
    assert [r["profile"] for r in summary["runs"]] == [
        "prefix-share",
        "chunked",
        "aborts",
        "pressure",
    ]


def test_seed_002_fails_before_pr_1348_and_passes_after(tmp_path):
    repo = needs(REPO)
    flags = ("--lightllm-cache", "linear", "--profile", "aborts", "-c", "2")
    before = exported(repo, BEFORE, tmp_path)
    code, summary, output = gate(before, tmp_path / "before", *flags)
    assert code == 1, output
    run = summary["runs"][0]
    allocator = run["detectors"]["allocator"]
    assert allocator["verdict"] == "fail", allocator
    assert "lightllm.state" in allocator["evidence"], allocator
    assert "pending big page" in allocator["evidence"], allocator
    assert run["detectors"]["tree"]["verdict"] == "fail"
    assert "root is in _evict_tree_set" in run["detectors"]["tree"]["evidence"]
    assert "AssertionError" in run["error"] and "infer_batch.py:132" in run["error"], run
    after = exported(repo, AFTER, tmp_path)
    code, summary, output = gate(after, tmp_path / "after", *flags)
    assert code == 0, output
    assert summary["verdict"] == "pass"
