"""The history generator (``histories/generate.py``) and the history format (``ops.py``)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from kvwatch.histories.generate import Plan, generate
from kvwatch.histories.ops import ABORT, CLOSE, OPEN, SUBMIT, TURN, History
from kvwatch.targets.driver.history_target import Shape

SHAPE = Shape(engine="kvwatch", page=16, chunk=32, context=512, unit=64)


def test_the_same_seed_gives_the_same_history_and_another_seed_another():
    assert generate(SHAPE, 7) == generate(SHAPE, 7)
    assert generate(SHAPE, 7) != generate(SHAPE, 8)


@settings(max_examples=30)
@given(seed=st.integers(0, 10_000))
def test_a_history_round_trips_through_json_and_keeps_its_orders(seed):
    history = generate(SHAPE, seed, Plan(turns=3, ops_per_turn=10))
    again = History.from_json(json.loads(json.dumps(history.to_json())))
    assert again == history
    for t in range(history.turns):
        ops = history.of_turn(t)
        assert [op.at for op in ops] == sorted(op.at for op in ops)
        sent = {op.rid: op.at for op in ops if op.kind in (SUBMIT, TURN)}
        for op in ops:
            if op.kind == ABORT and op.rid in sent:
                assert op.at >= sent[op.rid], op  # never before the request it aborts
        opened = {op.session: op.at for op in ops if op.kind == OPEN}
        for op in ops:
            if op.kind in (TURN, CLOSE) and op.session in opened:
                assert op.at >= opened[op.session], op
    for op in history.ops:
        if op.kind in (SUBMIT, TURN):
            assert len(op.tokens) >= 1 and len(op.tokens) + op.max_new <= SHAPE.context
            assert all(SHAPE.vocab[0] <= tok < SHAPE.vocab[1] for tok in op.tokens)


def test_prompts_sit_on_the_page_chunk_and_unit_edges_and_fill_the_context():
    lengths = {
        len(op.tokens)
        for seed in range(20)
        for op in generate(SHAPE, seed).ops
        if op.kind == SUBMIT
    }
    for edge in (15, 16, 17, 32, 33, 63, 64, 65):
        assert any(n == edge or n - edge in (0, 1, 3) for n in lengths), edge
    fills = [
        op
        for seed in range(20)
        for op in generate(SHAPE, seed).ops
        if op.kind == SUBMIT and len(op.tokens) + op.max_new == SHAPE.context
    ]
    assert fills  # some requests exactly fill the context


def test_no_request_id_is_a_prefix_of_another():
    """SGLang aborts every request whose id starts with the one named."""
    rids = [op.rid for op in generate(SHAPE, 3, Plan(turns=6, ops_per_turn=20)).ops if op.rid]
    ids = set(rids)
    assert not any(a != b and b.startswith(a) for a in ids for b in ids)


def test_an_unknown_operation_in_a_file_is_refused():
    data = generate(SHAPE, 1).to_json()
    data["ops"][0]["kind"] = "explode"
    try:
        History.from_json(data)
    except ValueError as exc:
        assert "explode" in str(exc)
    else:
        raise AssertionError("an unknown operation was read")


def test_turns_apart_keeps_a_sessions_turns_off_one_step():
    plan = Plan(turns=4, ops_per_turn=16, same_step_turns=False)
    for seed in range(10):
        seen = set()
        for op in generate(SHAPE, seed, plan).ops:
            if op.kind == TURN:
                assert (op.turn, op.at, op.session) not in seen, op
                seen.add((op.turn, op.at, op.session))
