"""A client history: operations on an ``EngineLoop``, each placed at a chosen step.

A history is what a set of clients did to an engine, nothing else: the
requests they sent (with their tokens), the sessions they opened and closed,
the aborts and the cache flushes, each at the step of its turn where it
reached the engine. It is played turn by turn (``play.py``); a turn's
operations run just before their step, and the loop runs until it is idle
before the next turn starts::

    turn 0   at 0: open s0, submit r0 (40 tokens), turn s0/t0 (9 new)
             at 3: abort r0 once it is decoding
             at 5: flush
    turn 1   at 0: turn s0/t1 (17 new) ...

An abort with a ``stage`` waits, from its step on, until its request is in
that stage (``STAGES``) and fires then; one whose request never gets there
does nothing. ``waiting`` is the queue once a step went by without admitting
the request (the engine looked at it and held it back: memory, a full batch). An operation ``after`` a request waits, from its step on, for
that request to end (a client sends its next turn once it has the answer). A ``turn`` carries the turn's new tokens only: the engine's
session adds what it committed (and the content check holds it to that).

Invariant: a history is plain data (``to_json`` / ``from_json`` round-trip
exactly), and every operation names the request or session it acts on, so
dropping operations (the shrinker) leaves a history that still plays: an
abort of a request never sent, or a turn of a session never opened, is what
a client could send too.
"""

from __future__ import annotations

from typing import Any, NamedTuple

SUBMIT = "submit"  # a request outside any session: ``tokens`` is its whole prompt
TURN = "turn"  # a session's next turn: ``tokens`` are its new tokens
ABORT = "abort"  # the client gives up on ``rid``
OPEN = "open"  # a session opened
CLOSE = "close"  # a session closed
FLUSH = "flush"  # the cache flushed (refused while requests run)
KINDS = (SUBMIT, TURN, ABORT, OPEN, CLOSE, FLUSH)
# where an abort may wait for its request to be ("": at its step, wherever it is)
STAGES = ("queued", "prefilling", "decoding", "retracted", "paused", "waiting")
WAITING = "waiting"  # queued, and passed over by at least one step


class Op(NamedTuple):
    turn: int  # the turn it belongs to (a barrier after each)
    at: int  # the step of its turn just before which it runs
    kind: str  # one of KINDS
    rid: str = ""  # the request it sends or aborts
    session: str = ""  # the session it opens, closes or continues
    tokens: tuple[int, ...] = ()  # the prompt (submit) or the turn's new tokens (turn)
    max_new: int = 0  # tokens the request may generate
    priority: int | None = None
    stage: str = ""  # an abort's stage to wait for (STAGES), "" for none
    after: str = ""  # a request whose answer it waits for first (a client's next turn)

    def describe(self) -> str:
        """One line, for a saved history and a finding's evidence."""
        what = {
            SUBMIT: f"submit {self.rid} ({len(self.tokens)} tokens, max {self.max_new})",
            TURN: f"turn {self.rid} of {self.session} ({len(self.tokens)} new, max {self.max_new})",
            ABORT: f"abort {self.rid}" + (f" once {self.stage}" if self.stage else ""),
            OPEN: f"open {self.session}",
            CLOSE: f"close {self.session}",
            FLUSH: "flush",
        }[self.kind]
        wait = f", once {self.after} ended" if self.after else ""
        return f"turn {self.turn} step {self.at}{wait}: {what}"


class History(NamedTuple):
    engine: str  # the engine it was generated for (what its ``Shape`` described)
    seed: int
    ops: tuple[Op, ...]

    @property
    def turns(self) -> int:
        return max((op.turn for op in self.ops), default=-1) + 1

    def of_turn(self, t: int) -> list[Op]:
        return [op for op in self.ops if op.turn == t]

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "seed": self.seed,
            "ops": [{**op._asdict(), "tokens": list(op.tokens)} for op in self.ops],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> History:
        ops = []
        for raw in data["ops"]:
            if raw.get("kind") not in KINDS:
                raise ValueError(f"unknown operation {raw.get('kind')!r}; kinds are {KINDS}")
            ops.append(Op(**{**raw, "tokens": tuple(raw.get("tokens", ()))}))
        return cls(engine=data["engine"], seed=int(data["seed"]), ops=tuple(ops))
