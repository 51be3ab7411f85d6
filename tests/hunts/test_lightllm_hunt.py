"""``make lightllm-hunt``'s matrix, rows and markdown with no engine; exit 2 without a
checkout; and one live gate of a one-cache matrix (e2e, with ``KVWATCH_LIGHTLLM_SRC``).

A corpus row explains a finding only on a checkout that lacks the row's fix (``git
merge-base --is-ancestor`` in a repository made here), and a checkout without the
``linear`` cache gives ``unsupported`` rows, never findings.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from paths import REPO

from hunts import gate_tables, gates
from hunts import lightllm as hunt
from hunts.corpus import load_corpus
from kvwatch.targets.lightllm.checkout_check import LINEAR, NEEDED

LOADED = "LightLLM /src at 0123456789ab: its linear cache and infer loop on CPU\n"
LEAK = "turn 0: lightllm.state: 1 units allocated but held by no tree node or live request"


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def checkout(where: Path, *, linear: bool) -> Path:
    """A folder with the files ``checkout_check`` looks for (and the linear cache or not)."""
    for path in [*NEEDED, *([LINEAR] if linear else [])]:
        (where / path).parent.mkdir(parents=True, exist_ok=True)
        (where / path).write_text("")
    return where


def history(tmp_path: Path) -> tuple[Path, str, str]:
    """A repository of two commits: (its folder, the first, the second)."""
    repo = checkout(tmp_path / "repo", linear=True)
    git(repo, "init", "-q")
    for n in ("1", "2"):
        (repo / "n").write_text(n)
        git(repo, "add", "-A")
        git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", n)
    return repo, git(repo, "rev-parse", "HEAD~1"), git(repo, "rev-parse", "HEAD")


def corpus(buggy: str, fixed: str) -> list[dict]:
    return [
        {
            "id": "lightllm-pr-1",
            "engine": "lightllm",
            "buggy": buggy,
            "fixed": fixed,
            "gate": [
                "--engine",
                "lightllm-cache",
                "--lightllm-cache",
                "linear",
                "--profile",
                "aborts",
            ],
            "expect": "allocator",
            "result": f"{{'buggy': {{'evidence': '{LEAK}'}}}}",
        }
    ]


def leak_rows(engine: gates.HuntedEngine, release: str) -> list[dict]:
    group = gates.Group(release=release, cache="linear", page=1, seed=0, args=())
    run = {
        "profile": "aborts",
        "concurrency": 2,
        "detectors": {"allocator": {"verdict": "fail", "evidence": LEAK}},
    }
    return gates.rows_of(engine, group, {"runs": [run]}, LOADED, [2])


def test_a_finding_is_known_only_on_a_checkout_without_the_fix(tmp_path):
    repo, first, second = history(tmp_path)
    head = hunt.label(repo)
    assert head == second[:12]
    fixed_here = hunt.engine(corpus(first, second), {head: repo})
    (row,) = leak_rows(fixed_here, head)
    assert row["findings"][0]["known"] is None and row["verdict"] == "fail"
    git(repo, "checkout", "-q", first)
    before = hunt.label(repo)
    not_yet = hunt.engine(corpus(first, second), {before: repo})
    (row,) = leak_rows(not_yet, before)
    assert row["findings"][0]["known"] == "lightllm-pr-1"
    assert row["decided_by"] == "LightLLM's own infer loop"


def test_a_checkout_without_the_linear_cache_gives_unsupported_rows(tmp_path):
    old = checkout(tmp_path / "old", linear=False)
    groups = hunt.groups({"old": old}, 2)
    assert [(g.cache, g.seed, g.refused is None) for g in groups] == [
        ("radix", 0, True),
        ("radix", 1, True),
        ("linear", 0, False),
        ("linear", 1, False),
    ]
    engine = hunt.engine([], {"old": old})
    out = gates.run_group(engine, groups[2], [2, 4], timeout=5)  # no gate is started
    assert len(out) == len(hunt.PROFILES) * 2
    assert {r["verdict"] for r in out} == {"unsupported"}
    assert all("LinearAttPagedRadixCache" in r["unsupported"] for r in out)
    md = gate_tables.markdown(
        out, {"matrix": "m", "jobs": 1, "cores": 2, "wall_s": 0}, title="T", intro=[]
    )
    assert "| old | `linear/p1` | 0 | 0 | 0 | 0 | 8 | - |" in md
    assert "0 findings" in md and "No detector failed in any run." in md


def test_without_a_checkout_it_is_exit_2(monkeypatch, capsys):
    monkeypatch.delenv("KVWATCH_LIGHTLLM_SRC", raising=False)
    assert hunt.main(["--out", "unused", "--corpus", "unused.json"]) == 2
    assert "LIGHTLLM_SRC" in capsys.readouterr().err


@pytest.mark.e2e
def test_one_live_gate_on_the_checkout_passes_decided_by_lightllm():
    src = os.environ.get("KVWATCH_LIGHTLLM_SRC")
    if not src:
        pytest.skip(
            "set KVWATCH_LIGHTLLM_SRC to run LightLLM's own code (its source is not on PyPI)"
        )
    folder = Path(src).resolve()
    release = hunt.label(folder)
    (radix, *_) = hunt.groups({release: folder}, 1)
    engine = hunt.engine(load_corpus(REPO / "docs" / "real-bugs.json"), {release: folder})
    out = gates.run_group(engine, radix, [2], timeout=300)
    assert [r["profile"] for r in out] == list(hunt.PROFILES)
    assert {(r["verdict"], r["decided_by"]) for r in out} == {("pass", "LightLLM's own infer loop")}
