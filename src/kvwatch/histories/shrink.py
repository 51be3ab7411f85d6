"""Shrink a failing history to a small one that still fails the same way.

``shrink(history, fails, budget)`` tries smaller histories, each played on a
fresh engine by ``fails`` (True: it still shows the finding), and keeps every
one that fails:

1. whole turns dropped, the rest renumbered;
2. operations dropped, in halves, then quarters, ... down to one at a time
   (delta debugging's complement step);
3. each request's tokens cut to the first half, as long as that still fails;
4. each turn's operations moved earlier together, its first to step 0;
5. each operation moved to step 0 of its turn.

Every candidate is a valid history (``ops.py``: an abort of a request never
sent, a turn of a session never opened, play as a client's would), so no
step needs to know what the operations mean. At most ``budget`` candidates
are played; the result is the smallest failing one found by then.

Invariant: the returned history fails (it is the input or a candidate that
``fails`` accepted), and it has no more operations, tokens or steps than the
input.
"""

from __future__ import annotations

from collections.abc import Callable

from kvwatch.histories.ops import History, Op

Fails = Callable[[History], bool]


class _Budget:
    def __init__(self, fails: Fails, budget: int) -> None:
        self.fails, self.left, self.tried = fails, budget, 0

    def __call__(self, history: History) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        self.tried += 1
        return self.fails(history)


def _renumbered(history: History, ops: list[Op]) -> History:
    turns = sorted({op.turn for op in ops})
    number = {t: i for i, t in enumerate(turns)}
    return history._replace(ops=tuple(op._replace(turn=number[op.turn]) for op in ops))


def _drop_turns(history: History, fails: _Budget) -> History:
    t = 0
    while t < history.turns and history.turns > 1:
        smaller = _renumbered(history, [op for op in history.ops if op.turn != t])
        if fails(smaller):
            history = smaller
        else:
            t += 1
    return history


def _drop_ops(history: History, fails: _Budget) -> History:
    ops, n = list(history.ops), 2
    while len(ops) >= 2 and fails.left > 0:
        size = -(-len(ops) // n)
        for start in range(0, len(ops), size):
            rest = ops[:start] + ops[start + size :]
            if rest and fails(_renumbered(history, rest)):
                ops, n = rest, max(n - 1, 2)
                break
        else:
            if size == 1:
                break
            n = min(2 * n, len(ops))
    return _renumbered(history, ops)


def _replace_each(history: History, fails: _Budget, smaller: Callable[[Op], Op | None]) -> History:
    ops = list(history.ops)
    for i in range(len(ops)):
        while (op := smaller(ops[i])) is not None:
            trial = history._replace(ops=(*ops[:i], op, *ops[i + 1 :]))
            if not fails(trial):
                break
            ops[i] = op
    return history._replace(ops=tuple(ops))


def _half_tokens(op: Op) -> Op | None:
    return op._replace(tokens=op.tokens[: len(op.tokens) // 2]) if len(op.tokens) > 1 else None


def _earlier(op: Op) -> Op | None:
    return op._replace(at=0) if op.at > 0 else None


def _shift_turns(history: History, fails: _Budget) -> History:
    for t in range(history.turns):
        first = min((op.at for op in history.of_turn(t)), default=0)
        if first == 0:
            continue
        moved = tuple(op._replace(at=op.at - first) if op.turn == t else op for op in history.ops)
        if fails(history._replace(ops=moved)):
            history = history._replace(ops=moved)
    return history


def shrink(history: History, fails: Fails, budget: int = 300) -> tuple[History, int]:
    """The smallest failing history found in ``budget`` plays, and how many were played."""
    counted = _Budget(fails, budget)
    history = _drop_turns(history, counted)
    history = _drop_ops(history, counted)
    history = _replace_each(history, counted, _half_tokens)
    history = _shift_turns(history, counted)
    history = _replace_each(history, counted, _earlier)
    return history, counted.tried
