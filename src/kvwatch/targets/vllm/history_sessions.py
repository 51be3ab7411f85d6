"""vLLM's streaming-input sessions as the history tier's sessions: a turn is one input chunk.

``AsyncLLM.generate`` with an async generator of inputs sends each chunk as
a ``resumable`` request under the session's one id; the scheduler appends a
chunk that arrives while the one before runs to that request's
``streaming_queue``, and starts it once the one before stops. A chunk's
prompt is the session's prompt so far, the previous chunk's output but its
last sampled token (whose KV was never computed), and the chunk's own
tokens (``Scheduler._update_request_as_session``). The input stream's end
is a last, non-resumable request under the same id, which finishes the
session. An abort ends the whole session: nothing further is sent on it.

``StreamingSessions`` keeps, per session, its turns in order; what the
client received of each (the ``new_token_ids`` of the engine core's outputs
for that id, until one carries a finish reason), the prompt of each chunk as
its first schedule found it, and how each ended::

    session s0 (request id "s0"):  turn t1 [done]  turn t2 [running]  turn t3 [queued]
                                    ^ outputs      ^ current: the next outputs are t2's

Nothing here imports vLLM; ``history_core.HistoryCore`` builds the requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvwatch.targets.driver.engine_loop import ABORTED, FINISHED, Outcome, Refused


@dataclass
class ChunkTurn:
    rid: str
    session: str
    tokens: int  # its own new tokens
    max_new: int
    input: tuple[int, ...] | None = None  # the chunk's prompt at its first schedule
    output: list[int] = field(default_factory=list)
    done: bool = False


@dataclass
class StreamSession:
    sid: str
    turns: list[ChunkTurn] = field(default_factory=list)
    tokens: int = 0  # the session's tokens once every sent chunk ran (for the context)
    closed: bool = False
    over: bool = False  # its request ended: nothing more can be sent on it

    def current(self) -> ChunkTurn | None:
        """The turn whose chunk runs now or runs next: the first not done."""
        return next((t for t in self.turns if not t.done), None)


class StreamingSessions:
    def __init__(self, context: int) -> None:
        self.context = context
        self.by_id: dict[str, StreamSession] = {}
        self.turns: dict[str, ChunkTurn] = {}

    def open(self, sid: str) -> None:
        if sid in self.by_id and not self.by_id[sid].closed:
            raise Refused(f"session {sid} is already open")
        self.by_id[sid] = StreamSession(sid=sid)

    def is_open(self, sid: str) -> bool:
        s = self.by_id.get(sid)
        return s is not None and not s.closed and not s.over

    def add(self, rid: str, sid: str, tokens: int, max_new: int) -> StreamSession:
        """A next chunk the client may send: its session open, its stream not ended, and
        the session still inside the context once it ran (a client keeps it there: vLLM
        checks each chunk alone and caps the request at the context)."""
        s = self.by_id.get(sid)
        if s is None or s.closed:
            raise Refused(f"no open session {sid}")
        if s.over:
            raise Refused(f"session {sid} ended: its stream was aborted")
        grown = s.tokens + tokens + max_new
        if grown > self.context:
            raise Refused(
                f"session {sid} would hold {grown} tokens, past the context of {self.context}"
            )
        s.tokens = grown - 1  # the chunk's last sampled token is dropped by the next one
        turn = ChunkTurn(rid=rid, session=sid, tokens=tokens, max_new=max_new)
        s.turns.append(turn)
        self.turns[rid] = turn
        return s

    def received(self, sid: str, new_tokens: list[int], finished: str | None, step: int):
        """The engine core's output for ``sid``: its tokens go to the current turn; with a
        finish reason that turn ends (an ``Outcome``, else None)."""
        s = self.by_id.get(sid)
        turn = s.current() if s is not None else None
        if turn is None:
            return None
        turn.output.extend(new_tokens)
        if finished is None:
            return None
        turn.done = True
        status = FINISHED if finished in ("length", "stop") else ABORTED
        why = "" if status == FINISHED else finished
        return Outcome(rid=turn.rid, status=status, step=step, why=why)

    def end(self, sid: str, status: str, step: int, why: str = "") -> list[Outcome]:
        """The session's request ended (an abort, or the engine's own end): every turn not
        done ends with it, and nothing more is sent on the session."""
        s = self.by_id[sid]
        s.over = True
        ended = []
        for turn in s.turns:
            if not turn.done:
                turn.done = True
                ended.append(Outcome(rid=turn.rid, status=status, step=step, why=why))
        return ended
