"""The session registry: streaming sessions and their per-turn records (seed 003).

A session is a conversation that keeps its cache slot between turns. Each
turn must extend the session's tokens (append-only). With recording on,
every finished turn leaves a ``TurnRecord``: where its prompt ends, its
output tokens and logprobs and, when asked, the routed-expert blob of every
computed token. A record's whole sequence is the session's tokens up to its
end, so records share one token list. Records merge into one ``Trajectory``,
last record wins::

    record 1   [ prompt 1 | out 1 ]
    record 2   [ prompt 1 | out 1 | prompt 2 | out 2 ]          <- its blob covers all of it
    merged     tokens and blob of record 2; out 1 and out 2 marked for the loss

Only the last record's blob is ever read, and a rollback of at most
MAX_ROLLBACK steps can promote an earlier record to be last. So only the
last MAX_ROLLBACK + 1 records keep their blob: retained memory is
O(prefix), not O(turns x prefix).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from kvwatch.engine.cache.protocol import Handle
from kvwatch.engine.config import MAX_ROLLBACK
from kvwatch.engine.errors import (
    ErrorKind,
    SessionError,
    busy_session,
    closed_session,
    unknown_session,
)

if TYPE_CHECKING:
    from kvwatch.engine.request import Request

CLOSED_IDS_KEPT = 4096  # closed session ids remembered, to tell "closed" from "unknown"


class TurnRecord(NamedTuple):
    turn: int
    prompt_len: int  # the turn's sequence is the session's tokens[: prompt_len + len(output_ids)]
    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]  # of the output tokens
    routed_experts: np.ndarray | None  # (computed tokens, n_layers, top_k); None once dropped

    @property
    def end(self) -> int:
        return self.prompt_len + len(self.output_ids)


class Trajectory(NamedTuple):
    token_ids: list[int]
    loss_mask: list[int]  # 1 on every turn's output tokens
    logprobs: list[float]  # the output token's logprob where loss_mask is 1, else 0.0
    routed_experts: np.ndarray | None


class SessionRecords:
    def __init__(self, *, keep_every_blob: bool = False) -> None:
        self.records: list[TurnRecord] = []
        self.keep_every_blob = keep_every_blob  # the session-blob-retention fault

    def append(self, record: TurnRecord) -> None:
        self.records.append(record)
        if self.keep_every_blob:
            return
        stale = len(self.records) - 1 - (MAX_ROLLBACK + 1)
        if stale >= 0 and self.records[stale].routed_experts is not None:
            self.records[stale] = self.records[stale]._replace(routed_experts=None)

    def check_rollback(self, steps: int) -> None:
        if not 1 <= steps <= MAX_ROLLBACK:
            raise SessionError(
                f"a session rolls back 1 to {MAX_ROLLBACK} assistant steps, not {steps}",
                code="rollback_out_of_range",
            )
        if steps > len(self.records):
            raise SessionError(
                f"cannot roll back {steps} steps: the session has {len(self.records)} records",
                code="rollback_out_of_range",
            )

    def rollback(self, steps: int) -> None:
        self.check_rollback(steps)
        del self.records[-steps:]

    def merge(self, session_tokens: list[int]) -> Trajectory:
        if not self.records:
            return Trajectory(token_ids=[], loss_mask=[], logprobs=[], routed_experts=None)
        last = self.records[-1]
        tokens = session_tokens[: last.end]
        mask, logprobs = [0] * len(tokens), [0.0] * len(tokens)
        for rec in self.records:
            for i, lp in enumerate(rec.logprobs, start=rec.prompt_len):
                mask[i], logprobs[i] = 1, lp
        return Trajectory(
            token_ids=tokens, loss_mask=mask, logprobs=logprobs, routed_experts=last.routed_experts
        )

    @property
    def blob_bytes(self) -> int:
        return sum(r.routed_experts.nbytes for r in self.records if r.routed_experts is not None)


@dataclass(eq=False)
class Session:
    id: str
    record: bool
    routed_experts: bool
    tokens: list[int] = field(default_factory=list)  # the conversation; the holder reads this list
    holder: Handle | None = None  # the cache slot, from the first turn's admission on
    records: SessionRecords | None = None
    turn_ends: list[int] = field(default_factory=lambda: [0])  # len(tokens) after each turn
    in_flight: str | None = None  # id of the turn being served
    turn_start: int = 0  # len(tokens) before the turn in flight
    # the cache's ``end_turn``: the slot's frontier becomes a turn-end snapshot
    turn_ended: Callable[[Handle], None] | None = field(default=None, repr=False)
    keep_unrun_turn: bool = False  # the session-keeps-unrun-turn fault

    def start_turn(self, request_id: str, prompt: list[int]) -> None:
        """``prompt`` (checked by ``SessionRegistry.begin_turn``) becomes the session's
        tokens; ``end_turn`` takes the new part back if the turn never runs."""
        self.turn_start = len(self.tokens)
        self.tokens.extend(prompt[self.turn_start :])
        self.in_flight = request_id

    def end_turn(self, req: Request, *, record: bool) -> None:
        """A turn is over: the session moves on without ``req``.

        A finished turn (``record``) marks where it ended, in the session and
        in its cache slot, and, with recording on, leaves its record. A turn
        that ends without ever being admitted (aborted or failed while queued)
        computed nothing, so the session is left exactly as before it: its new
        tokens go, and a client that sends the message again gets it once. A
        turn cut after it ran (aborted mid-run, or failed) keeps what it added:
        its prompt and the output so far stay in the session, unrecorded, and
        the next turn goes on from them (the slot computed them); a rollback
        returns to recorded turn ends only.
        """
        req.tokens = list(req.tokens)  # the request keeps its own copy from now on
        self.in_flight = None
        if not record:
            if not req.admitted and not self.keep_unrun_turn:
                del self.tokens[self.turn_start :]
            return
        self.turn_ends = [*self.turn_ends[-(MAX_ROLLBACK + 1) :], len(self.tokens)]
        if self.holder is not None and self.turn_ended is not None:
            self.turn_ended(self.holder)
        if self.records is not None:
            experts = req.routed_experts
            blob = None if experts is None else np.array(experts.cpu().numpy(), copy=True)
            turn = len(self.records.records)
            rec = TurnRecord(
                turn=turn,
                prompt_len=req.prompt_len,
                output_ids=tuple(req.output_ids),
                logprobs=tuple(req.logprobs),
                routed_experts=blob,
            )
            self.records.append(rec)


class SessionRegistry:
    # ``closed`` keeps the last CLOSED_IDS_KEPT ids on purpose (registry walks check it)
    __bounded__ = MappingProxyType({"closed": CLOSED_IDS_KEPT})

    def __init__(
        self,
        *,
        keep_every_blob: bool = False,
        keep_unrun_turns: bool = False,
        turn_ended: Callable[[Handle], None] | None = None,
    ) -> None:
        """``turn_ended(slot)`` is told of every recorded turn end (the cache's
        ``end_turn``), so the slot keeps turn-end snapshots where turns ended."""
        self.open: dict[str, Session] = {}
        self.closed: OrderedDict[str, None] = OrderedDict()
        self.keep_every_blob = keep_every_blob
        self.keep_unrun_turns = keep_unrun_turns  # the session-keeps-unrun-turn fault
        self.turn_ended = turn_ended
        self.closed_total = 0  # every session ever closed (``closed`` keeps the last ids)
        self._ids = itertools.count()

    def create(self, session_id: str | None, *, record: bool, routed_experts: bool) -> Session:
        sid = session_id if session_id is not None else f"sess-{next(self._ids)}"
        if sid in self.open or sid in self.closed:
            raise SessionError(
                f"session id {sid!r} is already in use",
                kind=ErrorKind.CONFLICT,
                code="session_exists",
            )
        records = SessionRecords(keep_every_blob=self.keep_every_blob) if record else None
        session = self.open[sid] = Session(
            id=sid,
            record=record,
            routed_experts=routed_experts,
            records=records,
            turn_ended=self.turn_ended,
            keep_unrun_turn=self.keep_unrun_turns,
        )
        return session

    def get(self, session_id: str) -> Session:
        if session_id in self.open:
            return self.open[session_id]
        raise (
            closed_session(session_id) if session_id in self.closed else unknown_session(session_id)
        )

    def begin_turn(self, session_id: str, prompt: list[int]) -> Session:
        """Check that ``prompt`` may be the session's next turn; nothing changes if not."""
        session = self.get(session_id)
        if session.in_flight is not None:
            raise busy_session(session_id)
        n = len(session.tokens)
        if len(prompt) <= n or prompt[:n] != session.tokens:
            raise SessionError(
                f"a turn must extend session {session_id!r}: its prompt has to start with the "
                f"session's {n} tokens and add at least one",
                code="session_not_append_only",
            )
        return session

    def forget(self, session: Session) -> None:
        del self.open[session.id]
        self.closed_total += 1
        self.closed[session.id] = None
        while len(self.closed) > CLOSED_IDS_KEPT:
            self.closed.popitem(last=False)

    @property
    def blob_bytes(self) -> int:
        return sum(s.records.blob_bytes for s in self.open.values() if s.records)
