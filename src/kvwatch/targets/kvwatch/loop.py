"""``EngineLoop``: kvwatch's own ``Engine``, stepped in this process (``../driver``).

The gate drives kvwatch's engine over HTTP (``kvwatch serve``); the history
tier drives it here, through the same five operations as every other engine
stepped in process, so one generated history means the same thing on each::

    submit(rid, new, max_new, session_id)   Engine.add_request; a session turn is
                                            the session's tokens (what
                                            GET /v1/sessions/{id} tells its client)
                                            plus ``new``
    abort(rid)                              Engine.abort (at once between steps)
    step()                                  Engine.step, then every ended request
                                            taken: ``outcomes``, ``inputs``, ``outputs``
    flush()                                 Engine.flush_cache, refused while anything runs
    open_session / close_session            the engine's own session calls

A call the engine turns down at once (a caller error: a session busy or
unknown, a prompt it cannot take) raises ``Refused``, as a client reads a
4xx. ``stage(rid)`` is where a request is now, in the words of the history
tier's aborts (``queued``, ``prefilling``, ``decoding``, ``retracted``,
``paused``); ``hits`` holds, for every request the scheduler ever admitted,
the prompt tokens it found cached then (``RequestScheduled.hit_tokens``).

Invariant: the loop changes the engine only through its public calls; what
it reads (``request_info``, ``session_tokens``, ``take``) a client of the
HTTP server can read too.
"""

from __future__ import annotations

from typing import Any

from kvwatch.engine import Engine, EngineConfig, SamplingParams
from kvwatch.engine.errors import EngineError
from kvwatch.engine.events import RequestScheduled
from kvwatch.engine.request import DONE, Status
from kvwatch.targets.driver.engine_loop import ABORTED, FINISHED, EngineLoop, Outcome, Refused

FAILED = "failed"  # the engine ended it unasked (a request it could not serve)
_ENDED = {Status.FINISHED: FINISHED, Status.ABORTED: ABORTED, Status.FAILED: FAILED}


class KvwatchLoop(EngineLoop):
    engine = "kvwatch"
    unasked = FAILED
    session_keeps = "ran"  # a turn cut after it ran stays in its session (records.py)

    def __init__(self, config: EngineConfig) -> None:
        super().__init__()
        self.config = config
        self.core = Engine(config)
        self.live: dict[str, None] = {}  # submitted, not ended, in order
        self.inputs: dict[str, tuple[int, ...]] = {}  # what each request computes over
        self.outputs: dict[str, tuple[int, ...]] = {}  # what each request generated
        self.hits: dict[str, int] = {}  # admitted at least once: prompt tokens found cached
        self.core.events.subscribe(RequestScheduled, self._scheduled)

    @property
    def steps(self) -> int:
        return self.core.step_count

    # -- the operations ------------------------------------------------------------------
    def submit(
        self,
        rid: Any,
        prompt: list[int],
        max_new: int,
        session_id: str | None = None,
        priority: int | None = None,
    ) -> str:
        """A request, or a session's next turn (``prompt``: the turn's new tokens).
        ``priority`` is not an option of this engine and is ignored."""
        tokens = list(prompt)
        params = SamplingParams(max_tokens=max_new)
        try:
            if session_id is not None:
                tokens = [*self.core.session_tokens(session_id), *tokens]
            self.core.add_request(tokens, params, request_id=str(rid), session_id=session_id)
        except EngineError as exc:
            raise Refused(str(exc)) from None
        self.inputs[str(rid)] = tuple(tokens)
        self.live[str(rid)] = None
        return str(rid)

    def abort(self, rid: Any) -> None:
        self.core.abort(str(rid))
        self._collect()
        self.notify()

    def step(self) -> None:
        self.core.step()
        self._collect()
        self.notify()

    def flush(self) -> bool:
        if self.core.has_unfinished():
            return False
        self.core.flush_cache()
        return True

    def open_session(self, session_id: str) -> None:
        self.core.open_session(session_id)

    def close_session(self, session_id: str) -> None:
        try:
            self.core.close_session(session_id)
        except EngineError as exc:
            raise Refused(str(exc)) from None

    # -- what it reads -------------------------------------------------------------------
    def idle(self) -> bool:
        return not self.live and not self.core.has_unfinished()

    def live_rids(self) -> list[str]:
        return list(self.live)

    def session_open(self, session_id: str) -> bool:
        return session_id in self.core.open_sessions()

    def stage(self, rid: Any) -> str | None:
        """Where the request is now; None once it ended (or was never taken)."""
        info = self.core.request_info(str(rid))
        if info is None or info.status in DONE:
            return None
        if info.status is Status.WAITING:
            return "queued"
        if info.status is Status.RUNNING:
            return "decoding" if info.output_tokens else "prefilling"
        return str(info.status)  # retracted, paused

    def admitted(self, rid: Any) -> bool:
        return str(rid) in self.hits

    def hit_of(self, rid: Any) -> int | None:
        return self.hits.get(str(rid))

    def _scheduled(self, event: RequestScheduled) -> None:
        self.hits[event.request_id] = event.hit_tokens

    def input_of(self, rid: Any) -> tuple[int, ...] | None:
        return self.inputs.get(str(rid))

    def output_of(self, rid: Any) -> tuple[int, ...]:
        return self.outputs.get(str(rid), ())

    def _collect(self) -> None:
        """Take every request that ended: its outcome and its output."""
        for rid in list(self.live):
            info = self.core.request_info(rid)
            if info is None or info.status not in DONE:
                continue
            done = self.core.take(rid)
            del self.live[rid]
            self.outputs[rid] = tuple(done.token_ids)
            status = _ENDED[info.status]
            self.outcomes.append(
                Outcome(rid=rid, status=status, step=self.steps, why=done.error or "")
            )
