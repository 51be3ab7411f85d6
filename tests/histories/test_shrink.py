"""The shrinker (``histories/shrink.py``): smaller histories that still fail, within a budget."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvwatch.histories.generate import Plan, generate
from kvwatch.histories.ops import ABORT, SUBMIT, History
from kvwatch.histories.shrink import shrink
from kvwatch.targets.driver.history_target import Shape

SHAPE = Shape(engine="kvwatch", page=16, chunk=32, context=512, unit=64)


def _fails_on_a_long_aborted_request(history: History) -> bool:
    """A stand-in for an engine bug: an abort of a request of 8 tokens or more."""
    long = {op.rid for op in history.ops if op.kind == SUBMIT and len(op.tokens) >= 8}
    return any(op.kind == ABORT and op.rid in long for op in history.ops)


def _a_failing_history() -> History:
    for seed in range(50):
        history = generate(SHAPE, seed, Plan(turns=4, ops_per_turn=12))
        if _fails_on_a_long_aborted_request(history):
            return history
    raise AssertionError("no generated history aborts a long request")


def test_a_failure_shrinks_to_the_two_operations_it_needs_with_no_more_tokens_than_it_needs():
    history = _a_failing_history()
    small, plays = shrink(history, _fails_on_a_long_aborted_request)
    assert _fails_on_a_long_aborted_request(small)
    assert [op.kind for op in small.ops] == [SUBMIT, ABORT]
    assert 8 <= len(small.ops[0].tokens) < 16  # halved while it still failed
    assert small.turns == 1 and small.ops[0].at == 0
    assert 0 < plays <= 300


def test_the_budget_bounds_the_plays_and_what_comes_back_still_fails():
    history = _a_failing_history()
    calls = []

    def fails(h: History) -> bool:
        calls.append(h)
        return _fails_on_a_long_aborted_request(h)

    small, plays = shrink(history, fails, budget=5)
    assert plays == len(calls) <= 5
    assert _fails_on_a_long_aborted_request(small)
    assert len(small.ops) <= len(history.ops)


@settings(max_examples=25)
@given(seed=st.integers(0, 5_000), keep=st.integers(0, 30))
def test_a_shrunk_history_fails_and_is_no_larger(seed, keep):
    """Whatever the bug looks like (here: operation ``keep`` of the original, whatever
    else is dropped), the result fails and has no more operations or tokens."""
    history = generate(SHAPE, seed, Plan(turns=3, ops_per_turn=10))
    needed = history.ops[keep % len(history.ops)]

    def fails(h: History) -> bool:
        return any(
            op.kind == needed.kind and op.rid == needed.rid and op.session == needed.session
            for op in h.ops
        )

    small, _ = shrink(history, fails, budget=120)
    assert fails(small)
    assert len(small.ops) <= len(history.ops)
    assert sum(len(op.tokens) for op in small.ops) <= sum(len(op.tokens) for op in history.ops)
    assert len(small.ops) == 1
