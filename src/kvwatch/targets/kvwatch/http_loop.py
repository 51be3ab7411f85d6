"""``HttpLoop``: kvwatch's server driven over real HTTP, one engine step at a time.

The server runs with ``--enable-probe --step-by-step`` (``server/stepping.py``):
its engine steps only on ``POST /debug/step``, so the history tier places
client messages at the steps a history names, exactly as it does on an engine
stepped in process, while every message travels as a client sends it::

    submit(rid, new, max_new, session_id)   POST /v1/completions on a keep-alive
                                            connection (X-Request-Id: rid; a turn's
                                            prompt: the session's ``token_ids`` from
                                            GET /v1/sessions/{id}, then ``new``), streamed
                                            for every other request; returns once the
                                            server lists it (or refused it: Refused)
    abort(rid)                              the client closes its connection, wherever
                                            the request is; returns once the server
                                            dropped it (it noticed the client leave)
    step()                                  POST /debug/step; every request that ended in
                                            it read by its client (outcome, token ids)
    flush()                                 POST /debug/flush_cache (409: False)
    open_session / close_session            POST /v1/sessions, DELETE /v1/sessions/{id}

What a request computed over is what the server answers in
``prompt_token_ids``; for one that never finished, the session's tokens
when the turn was sent (``token_ids``) and its new tokens. Its output is the token ids its
client received (a session turn cut after it ran: what its session kept of
it, which a client that did not stream never received). Its cache hit is the answer's ``cached_tokens``, or what
``/debug/requests`` listed once it ran.

Invariant: the engine moves only inside ``step``; each operation returns once
the server has taken it in, so a history plays the same way every time.
"""

from __future__ import annotations

import time
from typing import Any

from kvwatch import MODEL_NAME
from kvwatch.engine.request import Status
from kvwatch.targets.driver.engine_loop import ABORTED, FINISHED, EngineLoop, Outcome, Refused
from kvwatch.targets.kvwatch.http_calls import Call, Connections

FAILED = "failed"
SETTLE_S = 60.0  # the longest a taken-in message may take to show on the server
STEP_S = 120.0  # the longest one engine step may take (a step of these pools takes ms)
POLL_S = 0.005
_STAGES = {Status.RETRACTED: "retracted", Status.PAUSED: "paused"}


class NotTakenIn(RuntimeError):
    """The server did not take a message in within ``SETTLE_S``: a finding of its own."""


class HttpLoop(EngineLoop):
    engine = "kvwatch over HTTP"
    unasked = FAILED
    session_keeps = "ran"  # the same engine as ``KvwatchLoop``

    def __init__(self, url: str) -> None:
        super().__init__()
        self.pool = Connections(url)
        self.calls: dict[str, Call] = {}  # every request sent and taken in, in order
        self.ended: set[str] = set()
        self.listed: dict[str, dict] = {}  # the server's live requests, as last read
        self.step_count = 0
        self.inputs: dict[str, tuple[int, ...]] = {}  # as the client built them
        self.hits: dict[str, int] = {}  # ran at least once: prompt tokens found cached
        # a session turn cut after it ran: the output its session kept (GET /v1/sessions/{id}),
        # which a client that did not stream never received
        self.kept: dict[str, tuple[int, ...]] = {}

    @property
    def steps(self) -> int:
        return self.step_count

    # -- the operations ------------------------------------------------------------------
    def submit(
        self,
        rid: Any,
        prompt: list[int],
        max_new: int,
        session_id: str | None = None,
        priority: int | None = None,
    ) -> str:
        rid = str(rid)
        base: list[int] = []
        if session_id is not None:
            status, data = self.pool.json("GET", f"/v1/sessions/{session_id}")
            if status != 200:
                raise Refused(_message(status, data))
            base = list(data["token_ids"])
        body: dict[str, Any] = {
            "model": MODEL_NAME, "prompt": [*base, *prompt], "max_tokens": max_new,
            "temperature": 0.0, "return_token_ids": True, "stream": _streamed(rid),
        }  # fmt: skip
        if body["stream"]:
            body["stream_options"] = {"include_usage": True}
        if session_id is not None:
            body["session_id"] = session_id
        call = Call(self.pool, rid, body)
        self._until(lambda: call.done.is_set() or rid in self._list(), f"{rid} was taken in")
        if rid not in self.listed:  # answered without being taken in: refused
            call.wait(SETTLE_S)
            raise Refused(call.error or f"{rid} was answered at once ({call.status})")
        self.calls[rid] = call
        self.inputs[rid] = (*base, *prompt)
        return rid

    def abort(self, rid: Any) -> None:
        rid = str(rid)
        call = self.calls.get(rid)
        if call is None or rid in self.ended or call.done.is_set():
            return  # answered already: its end is read at the step that ended it
        call.leave()
        self._until(
            lambda: rid not in self._list(), f"the server dropped {rid} once its client left"
        )
        call.wait(SETTLE_S)
        session = call.body.get("session_id")
        if session is not None:  # what the cut turn left in its session, beyond its input
            status, data = self.pool.json("GET", f"/v1/sessions/{session}")
            held = tuple(data.get("token_ids", ())) if status == 200 else ()
            sent = self.inputs[rid]
            self.kept[rid] = held[len(sent) :] if held[: len(sent)] == sent else ()
        self._end(rid, ABORTED)
        self.notify()

    def step(self) -> None:
        before = list(self.listed)  # in the order they arrived: outcomes keep it
        try:
            status, data = self.pool.json("POST", "/debug/step", timeout=STEP_S)
        except TimeoutError:
            raise NotTakenIn(
                f"step {self.step_count + 1} did not end within {STEP_S:g} s: the engine "
                "thread is still inside it"
            ) from None
        if status != 200:
            raise RuntimeError(f"POST /debug/step: {_message(status, data)}")
        self._take(data)
        for rid in (rid for rid in before if rid not in self.listed):
            call = self.calls[rid]
            if not call.wait(SETTLE_S):
                raise NotTakenIn(
                    f"{rid} ended at step {self.step_count}; its client did not hear the end "
                    f"within {SETTLE_S:g} s ({call.describe()})"
                )
            ok = call.status == 200 and call.finish_reason in ("stop", "length")
            self._end(rid, FINISHED if ok else FAILED, "" if ok else call.error)
        self.notify()

    def flush(self) -> bool:
        status, _ = self.pool.json("POST", "/debug/flush_cache")
        return status == 200

    def open_session(self, session_id: str) -> None:
        status, data = self.pool.json("POST", "/v1/sessions", {"session_id": session_id})
        if status != 200:
            raise Refused(_message(status, data))

    def close_session(self, session_id: str) -> None:
        status, data = self.pool.json("DELETE", f"/v1/sessions/{session_id}")
        if status != 200:
            raise Refused(_message(status, data))

    def close(self) -> None:
        for call in self.calls.values():
            if not call.done.is_set():
                call.leave()
        self.pool.close()

    # -- what it reads -------------------------------------------------------------------
    def idle(self) -> bool:
        return not self._list() and all(rid in self.ended for rid in self.calls)

    def live_rids(self) -> list[str]:
        return [rid for rid in self.calls if rid not in self.ended]

    def session_open(self, session_id: str) -> bool:
        return self.pool.json("GET", f"/v1/sessions/{session_id}")[0] == 200

    def stage(self, rid: Any) -> str | None:
        row = self.listed.get(str(rid))
        if row is None:
            return None
        status = Status(row["status"])
        if status is Status.WAITING:
            return "queued"
        if status is Status.RUNNING:
            return "decoding" if row["output_tokens"] else "prefilling"
        return _STAGES.get(status, str(status))

    def admitted(self, rid: Any) -> bool:
        return str(rid) in self.hits

    def hit_of(self, rid: Any) -> int | None:
        return self.hits.get(str(rid))

    def input_of(self, rid: Any) -> tuple[int, ...] | None:
        call = self.calls.get(str(rid))
        if call is not None and call.prompt_ids is not None:
            return tuple(call.prompt_ids)  # what the server says it computed over
        return self.inputs.get(str(rid))

    def output_of(self, rid: Any) -> tuple[int, ...]:
        """The token ids its client received; for a session turn cut after it ran, what
        its session kept of it."""
        call = self.calls.get(str(rid))
        if call is None:
            return ()
        return self.kept.get(str(rid), tuple(call.tokens))

    # -- the server's account ------------------------------------------------------------
    def _list(self) -> dict[str, dict]:
        status, data = self.pool.json("GET", "/debug/requests")
        if status != 200:
            raise RuntimeError(f"GET /debug/requests: {_message(status, data)}")
        self._take(data)
        return self.listed

    def _take(self, data: dict) -> None:
        self.step_count = data["step"]
        self.listed = {row["id"]: row for row in data["requests"]}
        for rid, row in self.listed.items():
            if row["status"] != Status.WAITING and rid not in self.hits:
                self.hits[rid] = row["cached_tokens"]

    def _end(self, rid: str, status: str, why: str = "") -> None:
        call = self.calls[rid]
        if status == FINISHED and call.cached is not None:
            self.hits.setdefault(rid, call.cached)  # ran and finished within one step
        self.ended.add(rid)
        self.outcomes.append(Outcome(rid=rid, status=status, step=self.step_count, why=why))

    def _until(self, done, what: str) -> None:
        deadline = time.monotonic() + SETTLE_S
        while not done():
            if time.monotonic() > deadline:
                raise NotTakenIn(f"not within {SETTLE_S:g} s: {what}")
            time.sleep(POLL_S)


def _streamed(rid: str) -> bool:
    """Every other request streams (by the digits of its id), so both kinds of client
    leave in every stage."""
    digits = "".join(c for c in rid if c.isdigit())
    return bool(digits) and int(digits) % 2 == 1


def _message(status: int, data: Any) -> str:
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        return f"{status} {error.get('code', '')}: {error.get('message', '')}"
    return f"{status}: {data!r}"[:300]
