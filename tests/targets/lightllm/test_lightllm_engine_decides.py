"""The LightLLM row: swapping kvwatch's side does not move a verdict LightLLM decides.

What kvwatch brings to a run of ``--engine lightllm-cache`` besides the load
is the model: LightLLM's own infer loop, backend, pools and caches run, and
the forward and the sampler are stood in (``forward_stand_in.py``): the
forward writes the batch's KV slots as LightLLM's model does, and the token
each request samples comes from kvwatch's ``next_token``. Here every run's
plan gets a ``token_salt``, so the stand-in samples other tokens (another
function of the same inputs), then the row's two gates run in this process on
the two commits, exported from ``KVWATCH_LIGHTLLM_REPO``: each must end as
the corpus says (exit, failing detector, and the LightLLM pools and holders
its evidence names), and each driver's record must show the salted function
ran (the salt, and tokens sampled). With the tokens kvwatch makes up
swapped, the verdict is still the one LightLLM's chunked prefill, abort path
and linear-attention cache reach: LightLLM's own code decided it. The row is
decided by the engine on both commits. LightLLM is not on PyPI: skipped,
saying why, without a repository holding both commits.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvwatch import cli
from kvwatch.targets.lightllm import forward_stand_in, target
from kvwatch.targets.lightllm.checkout_check import export
from mutation import real_bugs

ROWS = [r for r in real_bugs.load() if r.engine == "lightllm" and r.gate is not None]
SALT = 7
# what an evidence line names: LightLLM's pools, and who last held a unit
PHRASES = (
    "lightllm.kv",
    "lightllm.req",
    "lightllm.state",
    "lightllm.small_state",
    "held by no tree node or live request",
    "pending big page",
    "aborted and never released",
)


def signature(evidence: str) -> set[str]:
    return {p for p in PHRASES if p in evidence}


def salted(monkeypatch) -> None:
    """Every driver plan asks for the salted token function."""
    plan = target.LightllmServed.plan

    def with_salt(self, spec):
        return {**plan(self, spec), "token_salt": SALT}

    monkeypatch.setattr(target.LightllmServed, "plan", with_salt)


def test_the_salted_token_function_is_another_function():
    reqs = [
        SimpleNamespace(req_id=rid, get_cur_total_len=lambda n=n: n)
        for rid in range(1, 40)
        for n in range(1, 100)
    ]
    same = sum(forward_stand_in.next_token(r, SALT) == forward_stand_in.next_token(r) for r in reqs)
    assert same < len(reqs) // 100, same
    assert all(1000 <= forward_stand_in.next_token(r, SALT) < 2000 for r in reqs)


def exported(repo: Path, commit: str, where: Path) -> Path:
    try:
        return export(repo, commit, where)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"{repo} does not hold LightLLM commit {commit}: {exc.stderr[:200]!r}")


@pytest.mark.e2e
@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_swapping_kvwatchs_side_does_not_move_the_verdict(row, tmp_path, monkeypatch, capsys):
    repo = os.environ.get(real_bugs.LIGHTLLM_REPO)
    if not repo:
        pytest.skip(f"set {real_bugs.LIGHTLLM_REPO} to a LightLLM git repository (not on PyPI)")
    assert row.decided_by == "engine", row.decided_by
    salted(monkeypatch)
    for name, commit in (("buggy", row.buggy), ("fixed", row.fixed)):
        src = exported(Path(repo), commit, tmp_path)
        out = tmp_path / name
        code = cli.main(row.argv(str(src), out))
        summary = json.loads((out / "summary.json").read_text())
        side = real_bugs.side_of(code, summary, row.expect, capsys.readouterr().out)
        want = row.result[name]
        assert (side.exit, side.detector) == (want.exit, want.detector), side
        assert signature(side.evidence) == signature(want.evidence), side.evidence
        records = [json.loads(p.read_text()) for p in out.rglob(target.FILES.record)]
        assert records, f"no driver record under {out}"
        for record in records:
            assert record["tokens"]["salt"] == SALT, record["tokens"]
            assert record["tokens"]["sampled"] > 0, record["tokens"]
