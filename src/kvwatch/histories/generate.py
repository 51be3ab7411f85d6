"""Seeded client histories for an engine of a given ``Shape``.

``generate(shape, seed, plan)`` draws a ``History``: requests, session turns,
aborts (at a step, or once the request is in a chosen stage), opens, closes
and flushes, in orders no hand-written profile sends: a next turn while the
previous one still waits or was just aborted, an abort of a queued turn, a
flush while requests run, a close of a busy session.

Lengths sit on the engine's edges. Prompts are drawn from a few shared
prefixes (``families``) cut at a page, chunk or unit edge, one token either
side, or anywhere, and then go their own way, so requests share pages with
one another, part inside a page and inside a cached node::

    family  |p0|p1|p2|p3|p4|p5|...
    r1      |p0|p1|p2|xx|              cut at 3 pages, then its own tokens
    r2      |p0|p1|p2|p3|p4|y          cut at 5 pages + 1: shares r1's node, then parts

Invariant: the same (shape, seed, plan) gives the same history on every
machine (one ``random.Random(seed)`` draws everything).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kvwatch.histories.ops import ABORT, CLOSE, FLUSH, OPEN, STAGES, SUBMIT, TURN, History, Op
from kvwatch.targets.driver.history_target import Shape

MAX_NEW = (1, 2, 4, 8, 16)  # what a request may generate
MAX_OPEN = 3  # sessions open at once


@dataclass(frozen=True)
class Plan:
    """How much one history holds."""

    turns: int = 3
    ops_per_turn: int = 10
    spread: int = 12  # a turn's operations are placed at its steps [0, spread)
    families: int = 2  # shared prefixes prompts start from
    fill_context: float = 0.05  # the share of requests that exactly fill the context
    waits: float = 0.75  # the share of next turns sent once the previous one ended
    # whether two turns of one session may reach the engine at the same step; False
    # keeps a crash that pattern already found out of a hunt's way
    same_step_turns: bool = True

    def allows(self, history: History) -> bool:
        """Whether ``history`` keeps this plan's rules (a shrunk one may not): without
        ``same_step_turns`` no two turns of a session at one step; with every next turn
        waiting (``waits`` 1), each one waits for its session's previous turn."""
        turns = [op for op in history.ops if op.kind == TURN]
        if not self.same_step_turns:
            placed = [(op.turn, op.at, op.session) for op in turns]
            if len(placed) != len(set(placed)):
                return False
        if self.waits >= 1:
            last: dict[tuple[int, str], str] = {}
            for op in turns:
                previous = last.get((op.turn, op.session))
                if previous and op.after != previous:
                    return False
                last[op.turn, op.session] = op.rid
        return True


# operation kinds and their weights
WEIGHTS = {SUBMIT: 26, TURN: 34, ABORT: 22, OPEN: 8, CLOSE: 5, FLUSH: 5}


class _Draw:
    def __init__(self, shape: Shape, seed: int, plan: Plan) -> None:
        self.shape, self.plan = shape, plan
        self.rng = random.Random(seed)
        sizes = (shape.page, 2 * shape.page, 3 * shape.page, shape.chunk, shape.unit)
        self.edges = sorted(
            {k * n + d for n in sizes if n for k in (1, 2) for d in (-1, 0, 1) if k * n + d > 0}
        )
        self.families = [self.tokens(2 * self.edges[-1]) for _ in range(plan.families)]
        self.open: list[str] = []
        self.sent: list[str] = []  # request ids of the turn being drawn, in order
        self.turns_of: dict[str, int] = {}
        self.last_turn: dict[str, str] = {}  # each session's last turn drawn this turn
        self.n_sessions = self.n_requests = 0

    def tokens(self, n: int) -> list[int]:
        lo, hi = self.shape.vocab
        return [self.rng.randrange(lo, hi) for _ in range(n)]

    def length(self) -> int:
        return self.rng.choice(self.edges) if self.rng.random() < 0.7 else self.rng.randint(1, 40)

    def prompt(self) -> tuple[tuple[int, ...], int]:
        """A prompt and its max_new: a family's prefix cut at an edge, then its own tokens."""
        max_new = self.rng.choice(MAX_NEW)
        family = self.rng.choice(self.families)
        cut = self.length() * self.rng.choice((1, 1, 2))
        prompt = family[:cut] + self.tokens(self.rng.choice((0, 1, 3, self.length())))
        if self.rng.random() < self.plan.fill_context:
            room = self.shape.context - max_new
            prompt = (prompt * (room // len(prompt) + 1))[:room]
        return tuple(prompt[: self.shape.context - max_new]), max_new

    def open_session(self, t: int, at: int) -> Op:
        sid = f"s{self.n_sessions}"
        self.n_sessions += 1
        self.open.append(sid)
        self.turns_of[sid] = 0
        return Op(turn=t, at=at, kind=OPEN, session=sid)

    def op(self, t: int) -> Op | None:
        kinds, weights = zip(*WEIGHTS.items(), strict=True)
        kind = self.rng.choices(kinds, weights)[0]
        at = self.rng.randrange(self.plan.spread)
        if kind == SUBMIT:
            self.n_requests += 1
            rid = f"r{self.n_requests:04d}"  # no id a prefix of another (SGLang's aborts)
            self.sent.append(rid)
            prompt, max_new = self.prompt()
            priority = self.rng.randint(0, 2) if self.shape.priorities else None
            return Op(
                turn=t,
                at=at,
                kind=SUBMIT,
                rid=rid,
                tokens=prompt,
                max_new=max_new,
                priority=priority,
            )
        if kind == OPEN and self.shape.sessions and len(self.open) < MAX_OPEN:
            return self.open_session(t, at)
        if kind == TURN and self.open:
            sid = self.rng.choice(self.open)
            rid = f"{sid}-t{self.turns_of[sid]:03d}"
            self.turns_of[sid] += 1
            self.sent.append(rid)
            if self.turns_of[sid] > 1:
                new, max_new = tuple(self.tokens(self.length())), self.rng.choice(MAX_NEW)
            else:  # a conversation starts from a shared prefix (a system prompt), as requests do
                new, max_new = self.prompt()
            # most clients wait for the answer; some send on while it runs
            last = self.last_turn.get(sid, "")
            after = last if self.rng.random() < self.plan.waits else ""
            self.last_turn[sid] = rid
            priority = self.rng.randint(0, 2) if self.shape.priorities else None
            return Op(turn=t, at=at, kind=TURN, rid=rid, session=sid, tokens=new,
                      max_new=max_new, after=after, priority=priority)  # fmt: skip
        if kind == ABORT and self.sent:
            turns = [rid for rid in self.sent if "-t" in rid]  # a session's turns
            pool = turns if turns and self.rng.random() < 0.5 else self.sent
            rid = self.rng.choice(pool)  # one this turn sends
            stage = self.rng.choice(("", *STAGES))
            # at once: soon after it is sent (queued, prefilling); a stage: whenever
            soon = self.rng.randrange(4) if not stage else at
            return Op(turn=t, at=soon, kind=ABORT, rid=rid, stage=stage)
        if kind == CLOSE and self.open:
            sid = self.open.pop(self.rng.randrange(len(self.open)))
            return Op(turn=t, at=at, kind=CLOSE, session=sid)
        if kind == FLUSH:
            return Op(turn=t, at=at, kind=FLUSH)
        return None


def generate(shape: Shape, seed: int, plan: Plan | None = None) -> History:
    """A seeded history of ``plan.turns`` turns for an engine of ``shape``."""
    plan = plan or Plan()
    draw = _Draw(shape, seed, plan)
    ops: list[Op] = []
    for t in range(plan.turns):
        draw.sent, draw.last_turn = [], {}
        turn: list[Op] = []
        if shape.sessions and not draw.open:  # a turn with sessions to talk to
            turn.append(draw.open_session(t, 0))
        while len(turn) < plan.ops_per_turn:
            if (op := draw.op(t)) is not None:
                turn.append(op)
        ops.extend(_ordered(turn, plan.same_step_turns))
    return History(engine=shape.engine, seed=seed, ops=tuple(ops))


def _ordered(turn: list[Op], same_step_turns: bool = True) -> list[Op]:
    """By step; an abort no earlier than the request it aborts, and a session's turn
    or close no earlier than its open and its previous turn (later, without
    ``same_step_turns``), where those were drawn before it in the turn."""
    sent_at: dict[str, int] = {}
    session_at: dict[str, int] = {}  # its open's or its last turn's step
    placed = []
    for op in turn:
        if op.kind in (OPEN, TURN, CLOSE):
            apart = op.kind == TURN and not same_step_turns and op.session in session_at
            op = op._replace(at=max(op.at, session_at.get(op.session, 0) + apart))
            session_at[op.session] = op.at
        if op.kind in (SUBMIT, TURN):
            sent_at[op.rid] = op.at
        elif op.kind == ABORT and op.rid in sent_at:
            soon = sent_at[op.rid] + op.at  # drawn as an offset from the send
            op = op._replace(at=soon if not op.stage else max(op.at, sent_at[op.rid]))
        placed.append(op)
    return sorted(placed, key=lambda op: op.at)  # stable: drawn order within a step
