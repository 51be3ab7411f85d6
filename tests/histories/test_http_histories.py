"""The history tier over real HTTP (``kvwatch-http``): kvwatch's server, step by step.

One generated history means the same thing on the engine stepped in process and on the
server driven by HTTP clients: the same requests refused, the same ones finished and
aborted, the same tokens. Clients stream every other request, reuse idle keep-alive
connections, and leave by closing their connection wherever their request is; a session
turn cut after it ran leaves in its session what ``GET /v1/sessions/{id}`` tells.
"""

from __future__ import annotations

from collections import Counter

import pytest

from kvwatch.histories.checks import judge
from kvwatch.histories.generate import Plan, generate
from kvwatch.histories.hunt import run_history
from kvwatch.histories.ops import SUBMIT
from kvwatch.histories.play import play
from kvwatch.targets.driver.engine_loop import ABORTED, FINISHED
from kvwatch.targets.kvwatch.histories import KvwatchHistoryTarget
from kvwatch.targets.kvwatch.http_histories import KvwatchHttpHistoryTarget
from kvwatch.targets.kvwatch.http_loop import _streamed

PLAN = Plan(turns=4, ops_per_turn=12)


def _played_over_http(target, history):
    loop = target.make_loop()
    try:
        played = play(loop, target.make_probe(loop), history, None)
    finally:
        loop.close()
    return played, loop


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_history_over_http_ends_as_it_does_in_process_and_passes(seed):
    http = KvwatchHttpHistoryTarget()
    history = generate(http.shape, seed, PLAN)
    played, loop = _played_over_http(http, history)
    verdict = judge(played, loop.unasked, http.reference())
    assert not verdict.findings, verdict.findings
    inproc, _ = run_history(KvwatchHistoryTarget(), history)
    assert {r: e.status for r, e in played.ended.items()} == {
        r: e.status for r, e in inproc.ended.items()
    }
    assert [op.rid or op.session for op, _ in played.refused] == [
        op.rid or op.session for op, _ in inproc.refused
    ]
    for rid, e in played.ended.items():
        if e.status == FINISHED:
            assert e.output == inproc.ended[rid].output, rid
    # both kinds of client ended both ways, and idle connections were used again
    kinds = Counter((_streamed(r), e.status) for r, e in played.ended.items())
    assert kinds[(True, FINISHED)] and kinds[(False, FINISHED)], kinds
    assert loop.pool.opened < len(loop.calls), (loop.pool.opened, len(loop.calls))


def test_clients_leave_in_every_stage_a_cut_turn_stays_and_exact_fills_are_served():
    http = KvwatchHttpHistoryTarget()
    stages: Counter[tuple[bool, str]] = Counter()
    kept, fills = 0, []
    for seed in range(3, 9):
        played, loop = _played_over_http(http, generate(http.shape, seed, PLAN))
        fills += [  # prompt and max_tokens exactly the context: served, never refused
            played.ended[rid].status
            for rid, sent in played.sent.items()
            if len(sent.expected) + sent.max_new == http.shape.context
        ]
        fills += [
            f"refused: {why}"
            for op, why in played.refused
            if op.kind == SUBMIT and len(op.tokens) + op.max_new == http.shape.context
        ]
        for rid, stage in played.aborted_in.items():
            if played.ended[rid].status == ABORTED:
                stages[(_streamed(rid), stage)] += 1
        kept += sum(1 for out in loop.kept.values() if out)
    for stage in ("queued", "prefilling", "decoding"):
        assert any(stages[(s, stage)] for s in (True, False)), stages
    assert stages[(True, "decoding")] + stages[(False, "decoding")] > 1, stages
    assert kept > 0  # a session kept output of a turn cut after it ran
    assert FINISHED in fills and set(fills) <= {FINISHED, ABORTED}, fills


def test_the_http_tier_catches_a_fault_and_the_replay_names_the_engine():
    http = KvwatchHttpHistoryTarget(faults=("session-keeps-unrun-turn",))
    failed = []
    for seed in range(3):
        _, verdict = run_history(http, generate(http.shape, seed, PLAN))
        failed.extend(f.check for f in verdict.findings)
    assert "content" in failed, failed
    assert http.describe()["engine"] == "kvwatch-http"
