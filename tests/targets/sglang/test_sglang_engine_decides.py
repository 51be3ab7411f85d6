"""Each SGLang row: swapping kvwatch's side does not move a verdict SGLang's scheduler decides.

What kvwatch brings to a run of SGLang's own ``Scheduler`` is the stand-in
model worker (its next-token function), the host around the scheduler (a
virtual clock, in-memory sockets, which decide nothing) and the load. Here
the model's tokens come from another function, then the row's two gates run
in this process on the releases themselves: each must end as the corpus says
(exit, failing detector, and the kinds of SGLang objects its evidence names),
and the swapped token function must have run: SGLang's own code decided the
verdict. A row decided
by the engine runs SGLang's own ``Scheduler`` on both releases. The wheels are
downloaded at test time (once per machine); skipped, saying why, when PyPI
cannot be reached.
"""

from __future__ import annotations

import json

import pytest

from kvwatch import cli
from kvwatch.targets.sglang import loop_choice, stand_in_worker, wheel_fetch
from mutation import real_bugs

pytestmark = pytest.mark.e2e
ROWS = [r for r in real_bugs.load() if r.engine == "sglang" and r.gate is not None]
# what an evidence line names, by kind of holder and what became of it
PHRASES = (
    "sglang.kv",
    "sglang.mamba",
    "SessionSlot row",
    "SessionSlot mamba slot",
    "mamba_pool_idx",
    "aborted-in-queue",
    "timed-out",
    "admission stalled",
)


def signature(evidence: str) -> set[str]:
    return {p for p in PHRASES if p in evidence}


def swap_kvwatchs_side(monkeypatch) -> dict[str, int]:
    """Make the model another one; count its calls."""
    used = {"tokens": 0}

    def other_token(self, seq_len: int) -> int:
        used["tokens"] += 1
        return 5 + (seq_len * 31337 + 11) % 20000

    monkeypatch.setattr(stand_in_worker.TokenModel, "next_token", other_token)
    return used


def own_sides(row: real_bugs.BugRow) -> list[tuple[str, str]]:
    """The sides of ``row`` that SGLang's own scheduler runs (downloading the wheels)."""
    sides = []
    for name, version in (("buggy", row.buggy), ("fixed", row.fixed)):
        try:
            root = wheel_fetch.fetch(version)
        except wheel_fetch.Unavailable as exc:
            pytest.skip(f"cannot download sglang {version}'s wheel (is PyPI reachable?): {exc}")
        try:
            loop_choice.plan_for(root)
        except loop_choice.Unsupported:
            continue
        sides.append((name, version))
    return sides


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_swapping_kvwatchs_side_does_not_move_the_verdict(row, tmp_path, monkeypatch, capsys):
    sides = own_sides(row)
    assert (len(sides) == 2) == (row.decided_by == "engine"), (row.decided_by, sides)
    used = swap_kvwatchs_side(monkeypatch)
    for name, version in sides:
        out = tmp_path / name
        code = cli.main(row.argv(version, out))
        summary = json.loads((out / "summary.json").read_text())
        side = real_bugs.side_of(code, summary, row.expect, capsys.readouterr().out)
        want = row.result[name]
        assert (side.exit, side.detector) == (want.exit, want.detector), side
        assert signature(side.evidence) == signature(want.evidence), side.evidence
    assert used["tokens"] > 0, used
