"""Each vLLM row: swapping kvwatch's side does not move a verdict vLLM's scheduler decides.

What kvwatch brings to a run of ``--engine vllm-scheduler`` besides the
load is the model runner: vLLM's own ``Scheduler`` runs with no model, and
the token each request samples comes from kvwatch's ``next_token``
(``run_driver.py``). Here every run's plan gets a ``token_salt``, so
the model runner samples other tokens (another function of the same inputs),
then the row's two gates run in this process on the releases themselves:
each must end as the corpus says (exit, failing detector, and the vLLM
holders and rules its evidence names), and each driver's record must show
the salted function ran (the salt, and tokens sampled). With the tokens
kvwatch makes up swapped, the verdict is still the one vLLM's scheduler,
block pool and hashes reach: vLLM's own code decided it. Every vLLM row is
decided by the engine, on both releases. Needs vLLM's venv and the rows'
releases (``make test-vllm``); skipped, saying why, without them.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from kvwatch import cli
from kvwatch.targets.vllm import model_runner, scheduler_target
from kvwatch.targets.vllm.release import find
from mutation import real_bugs

PYTHON = os.environ.get("KVWATCH_VLLM_PYTHON")
ROWS = [r for r in real_bugs.load() if r.engine == "vllm" and r.gate is not None]
SALT = 7
# what an evidence line names: the holder, then the rule (``vllm.kv: running-skipped: ...``)
RULE = re.compile(r"(vllm\.\w+): ([a-z]+(?:-[a-z]+)+):")


def signature(evidence: str) -> set[tuple[str, str]]:
    return set(RULE.findall(evidence))


def salted(monkeypatch) -> None:
    """Every driver plan asks for the salted token function."""
    plan = scheduler_target.SchedulerServed.plan

    def with_salt(self, spec):
        return {**plan(self, spec), "token_salt": SALT}

    monkeypatch.setattr(scheduler_target.SchedulerServed, "plan", with_salt)


def test_the_salted_token_function_is_another_function():
    ids = [
        f"{kind}-{i}"
        for kind in ("session", "reader-1", "high-0", "low", "wave-0")
        for i in range(4)
    ]
    pairs = [(rid, n) for rid in ids for n in range(1, 200)]
    same = sum(
        model_runner.next_token(rid, n, SALT) == model_runner.next_token(rid, n) for rid, n in pairs
    )
    assert same < len(pairs) // 100, same
    assert all(100 <= model_runner.next_token(rid, n, SALT) < 1600 for rid, n in pairs)


@pytest.mark.vllm
@pytest.mark.e2e
@pytest.mark.skipif(not PYTHON, reason="needs vLLM's venv: run `make test-vllm`")
@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_swapping_kvwatchs_side_does_not_move_the_verdict(row, tmp_path, monkeypatch, capsys):
    assert row.decided_by == "engine", row.decided_by
    for version in (row.buggy, row.fixed):
        try:
            find(version, PYTHON)
        except ValueError as exc:
            pytest.skip(str(exc))
    salted(monkeypatch)
    for name, version in (("buggy", row.buggy), ("fixed", row.fixed)):
        out = tmp_path / name
        code = cli.main([*row.argv(version, out), "--vllm-python", PYTHON])
        summary = json.loads((out / "summary.json").read_text())
        side = real_bugs.side_of(code, summary, row.expect, capsys.readouterr().out)
        want = row.result[name]
        assert (side.exit, side.detector) == (want.exit, want.detector), side
        assert signature(side.evidence) == signature(want.evidence), side.evidence
        records = [json.loads(p.read_text()) for p in out.rglob(scheduler_target.FILES.record)]
        assert records, f"no driver record under {out}"
        for record in records:
            assert record["tokens"]["salt"] == SALT, record["tokens"]
            assert record["tokens"]["sampled"] > 0, record["tokens"]
