"""EngineWorker: the one thread that owns the ``Engine``.

The engine is single-threaded and step-driven. HTTP handlers never touch it:
they send calls that run on the worker thread between two steps, and read
their request's deltas from an asyncio queue the worker fills::

    handler ──call(fn)──► [call queue] ──► worker: drain calls, step, dispatch
       ▲                                              │
       └──────── asyncio.Queue (RequestOutput ..., Completion) ◄┘

Each stream ends with the request's ``Completion``, taken from the engine
as soon as the request is done, so finished requests never pile up in it.

Aborts (a client went away) take a faster lane than calls: ``abort_soon``
is safe from any thread, and the worker hands pending aborts to the engine
both between steps and right after a step's batch ran (its
``on_batch_computed`` hook, a control call of the engine's, not an event).
So a disconnect that arrives while a batch computes lands at the engine's
own safe point inside that step: mid-prefill, mid-decode or mid-verify.

Two debugging aids for leak tests (the server offers them only with
``--enable-probe``), both applied between steps:

* *scripted retraction and pause*: a request submitted with a ``Scripted``
  retraction is pushed out, as pool pressure would, once it has computed that
  many tokens past its cached prefix, and held on the host tier for the given
  steps; a scripted pause lets it go without a commit once it has generated
  that many tokens, and resumes it after the given steps (or at once when
  nothing else runs), or held for a number of seconds instead. Asked to,
  either is then aborted once retracted, paused or recovering; a *scripted
  abort* alone aborts the request as it is queued, at the first step
  boundary where it is prefilling or decoding, or inside the step that
  verifies its drafts;
* *step by step*: with ``stepping`` set the thread never steps on its own; each
  ``step_once`` call (``POST /debug/step``) runs one step, between the calls
  and aborts that came before it, so a client history lands at chosen steps;
* *watching*: after every step the worker probes the engine and keeps each
  probe that shows a finding or an exceeded bound the step before did not
  (``latched``), so a state that lasts a few steps is seen however rarely a
  client probes.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

from kvwatch.contracts import ProbeReport
from kvwatch.engine.engine import Completion, Engine
from kvwatch.engine.request import RequestOutput, SamplingParams, Status
from kvwatch.engine.views import ComputedBatch, RequestInfo
from kvwatch.server.departures import Departures
from kvwatch.server.finished import FinishedLog
from kvwatch.server.overdue import IdleDeadlines
from kvwatch.server.worktime import WorkTime

IDLE_WAIT_S = 0.05
MAX_LATCHED = 16  # probes kept between two reads; later ones are counted, not kept


class Scripted(NamedTuple):
    action: str  # "retract" (after computing ``tokens`` past the cached prefix),
    #              "pause" (after generating ``tokens``) or "abort" (``abort_in`` alone)
    tokens: int
    hold_steps: int  # on the host tier, or paused, before it is admitted again
    abort_in: str | None = None  # then abort it once in that stage (``STAGES``)
    hold_s: float | None = None  # a pause held this long instead (never resumed early)
    fail_load: bool = False  # a retraction: the next host-tier load after its hold fails


_IN = {"retracted": Status.RETRACTED, "paused": Status.PAUSED, "recovering": Status.RUNNING}
# The stages a script aborts a request in with no retraction or pause first:
# "queued" as it is added, "verifying" inside the step that verifies its drafts
# (the batch hook), the others at the first step boundary that finds it there.
STAGES = ("queued", "prefilling", "decoding", "verifying")


def _reached(req: RequestInfo, stage: str) -> bool:
    """Whether a live request is in a scripted abort's stage at a step boundary:
    prefilling (admitted, no output yet), decoding (admitted, some output), or
    the status of retracted, paused or recovering (admitted again)."""
    if stage == "prefilling":
        return req.status is Status.RUNNING and req.output_tokens == 0
    if stage == "decoding":
        return req.status is Status.RUNNING and req.output_tokens > 0
    return stage in _IN and req.status is _IN[stage]


class EngineStopped(RuntimeError):
    """The engine's step raised outside a request's own failure paths. Its state
    is then unknown, so the worker stops stepping it: the streams in flight end
    with an error, and new requests are refused (503) instead of hanging."""


@dataclass(eq=False)
class Stream:
    """One request's deltas; the last item is its ``Completion``.

    Per-request state of the handler lives here, never in the ASGI scope:
    uvicorn keeps a keep-alive connection's last scope until its next request
    or its close (``KEEP_ALIVE_S``), which would tie the state's lifetime to
    an idle connection's instead of the request's.
    """

    request_id: str
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    # when the handler last asked whether its client is still connected
    checked_at: float = 0.0

    def put(self, item: RequestOutput | Completion) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


class EngineWorker:
    # the probes kept for /debug/latched: at most MAX_LATCHED (registry walks check it)
    __bounded__ = MappingProxyType({"_latched": MAX_LATCHED})

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future]] = queue.SimpleQueue()
        self._aborts: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._streams: dict[str, Stream] = {}
        self._wake = threading.Event()
        self._stopping = False
        self.failure: str | None = None  # set once a step raised; see EngineStopped
        self._scripted: dict[str, Scripted] = {}
        self._abort_in: dict[str, str] = {}  # scripted, to abort once in that state
        self._held: dict[str, int] = {}  # paused by a script: steps left before it resumes
        self._held_until: dict[str, float] = {}  # paused by a script until this monotonic time
        self._fail_load_in: dict[str, int] = {}  # retracted by a script: steps to its failed load
        self._watching = False
        self.stepping = False  # step only in step_once (step by step)
        self._latched: list[ProbeReport] = []
        self._dropped = 0
        self._last_seen: frozenset = frozenset()  # what the last step's probe showed
        self.finished: FinishedLog | None = None  # set with --enable-probe
        self.departures: Departures | None = None  # set with --enable-probe
        # and with --session-idle-timeout: the oracle of the idle timeout (overdue.py)
        self.deadlines: IdleDeadlines | None = None
        self.work = WorkTime()  # what this thread spent its CPU on (GET /debug/timing)
        self._thread = threading.Thread(target=self._run, name="kvwatch-engine", daemon=True)
        engine.on_batch_computed(self._on_batch)

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # -- calls --------------------------------------------------------------------------
    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        """Run ``fn`` on the worker thread between steps; its result or exception lands in the future."""
        future: Future = Future()
        self._calls.put((lambda: fn(*args, **kwargs), future))
        self._wake.set()
        return future

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.wrap_future(self.call(fn, *args, **kwargs))

    async def submit(
        self,
        prompt: Sequence[int],
        params: SamplingParams,
        *,
        session_id: str | None = None,
        labels: Mapping[str, str] | None = None,
        script: Scripted | None = None,
        request_id: str | None = None,
    ) -> Stream:
        """Queue a request (under ``request_id`` where the client named it); raises what
        ``Engine.add_request`` raises (bad input, an id in use)."""
        loop = asyncio.get_running_loop()

        def add() -> Stream:
            if self.failure is not None:
                raise EngineStopped(self.failure)
            rid = self.engine.add_request(
                prompt, params, request_id=request_id, session_id=session_id, labels=labels
            )
            stream = Stream(request_id=rid, loop=loop, queue=asyncio.Queue())
            self._streams[rid] = stream
            if script is None:
                return stream
            if script.action != "abort":
                self._scripted[rid] = script
            elif script.abort_in == "queued":
                self._order_abort(rid)  # queued, never admitted: its stream ends with the abort
            else:
                self._abort_in[rid] = script.abort_in
            return stream

        return await self.run(add)

    async def abort(self, request_id: str) -> None:
        """Abort a request (a client went away); its stream ends with the abort."""
        await self.run(self.abort_now, request_id)

    def abort_now(self, request_id: str) -> None:
        """On the worker thread: abort, and end the request's stream at once.

        Inside a step the engine defers the abort to its safe point; the
        stream then ends when that step's outputs are dispatched.
        """
        if self.engine.abort(request_id) and not self.engine.in_step:
            self._finish(request_id)

    def abort_soon(self, request_id: str) -> None:
        """From any thread: abort at the worker's next chance, mid-step if a step runs."""
        self._aborts.put(request_id)
        self._wake.set()

    # -- watching (between steps, on the worker thread) ---------------------------------
    def watch(self, on: bool) -> None:
        self._watching, self._latched, self._dropped = on, [], 0
        self._last_seen = frozenset()

    def latched(self) -> tuple[list[ProbeReport], int]:
        """The probes kept since the last call, and how many more were not kept."""
        out, dropped = self._latched, self._dropped
        self._latched, self._dropped = [], 0
        return out, dropped

    def _after_step(self) -> None:
        for rid, script in list(self._scripted.items()):
            req = self._live(rid)
            if req is None:
                del self._scripted[rid]
            elif self._due(req, script):
                del self._scripted[rid]
                if script.action == "retract":
                    self.engine.retract(rid, hold_steps=script.hold_steps)
                    if script.fail_load:
                        self._fail_load_in[rid] = script.hold_steps
                else:
                    self.engine.pause(rid)
                    self._hold(rid, script)
                if script.abort_in is not None:
                    self._abort_in[rid] = script.abort_in
        for rid, state in list(self._abort_in.items()):
            req = self._live(rid)
            if req is None:
                del self._abort_in[rid]
            elif _reached(req, state):
                self._order_abort(rid)  # the engine's abort; the request's stream ends with it
                del self._abort_in[rid]
        self._fail_loads()
        self._resume_held(everyone=False)
        self.check_departures()
        if self._watching:
            self.work.timed("watch_s", self._watch_step)

    def _fail_loads(self) -> None:
        """Count a step off each scripted failed load; once a request's hold is over
        (it may come back from the host tier at the next step), the next load fails."""
        for rid, left in list(self._fail_load_in.items()):
            req = self._live(rid)
            if req is None or req.status is not Status.RETRACTED:
                del self._fail_load_in[rid]  # gone, or came back without a load to fail
            elif left <= 1:
                del self._fail_load_in[rid]
                self.engine.fail_next("tier.load")
            else:
                self._fail_load_in[rid] = left - 1

    def check_departures(self) -> None:
        """On the worker thread: requests still running long after their client left,
        and sessions still open long after their idle timeout."""
        if self.departures is not None:
            self.departures.check(self.engine.step_count, lambda rid: self._live(rid) is not None)
        if self.deadlines is not None:
            self.deadlines.check(self.engine.step_count, self.engine.open_sessions)

    def _live(self, rid: str) -> RequestInfo | None:
        req = self.engine.request_info(rid)
        return None if req is None or req.done else req

    def _due(self, req: RequestInfo, script: Scripted) -> bool:
        if script.action == "retract":
            computed = self.engine.computed_beyond_cache(req.request_id)  # None unless it runs
            return computed is not None and computed >= script.tokens
        return req.status is Status.RUNNING and req.output_tokens >= script.tokens

    def _hold(self, rid: str, script: Scripted) -> None:
        if script.hold_s is None:
            self._held[rid] = script.hold_steps
        else:
            self._held_until[rid] = time.monotonic() + script.hold_s

    def _resume_timed(self) -> None:
        """Resume the scripted pauses held by time whose time is up (never earlier)."""
        now = time.monotonic()
        for rid, until in list(self._held_until.items()):
            req = self._live(rid)
            if req is None or req.status is not Status.PAUSED:
                del self._held_until[rid]
            elif now >= until:
                del self._held_until[rid]
                self.engine.resume(rid)

    def _on_batch(self, batch: ComputedBatch) -> None:
        """The batch hook: hand pending aborts to the engine, and abort the scripted
        ``verifying`` requests whose piece of this batch verifies drafts."""
        self._drain_aborts()
        for rid in batch.verifying:
            if self._abort_in.get(rid) == "verifying":
                del self._abort_in[rid]
                self._order_abort(rid)

    def _order_abort(self, rid: str) -> None:
        """A scripted abort come due: told to the departures oracle, then done."""
        if self.departures is not None:
            self.departures.ordered(rid, self.engine.step_count)
        self.abort_now(rid)

    def _resume_held(self, *, everyone: bool) -> None:
        """Count a step off every scripted pause; resume those whose hold is over
        (all of them with ``everyone``: nothing else runs, so no step would come).
        Pauses held by time resume when their time is up, whatever runs."""
        self._resume_timed()
        for rid, left in list(self._held.items()):
            req = self._live(rid)
            if req is None or req.status is not Status.PAUSED:
                del self._held[rid]
            elif everyone or left <= 0:
                del self._held[rid]
                self.engine.resume(rid)
            else:
                self._held[rid] = left - 1

    def _watch_step(self) -> None:
        """Keep this step's probe if it shows a kind of finding (per group) or an
        exceeded bound the previous step's did not: a state that lasts many steps,
        growing or not, is kept once, where it began."""
        report = self.engine.probe()
        seen = frozenset(
            [(f.kind, f.group) for f in report.findings]
            + [("bound", b.group) for b in report.exceeded()]
        )
        if seen - self._last_seen:
            if len(self._latched) < MAX_LATCHED:
                self._latched.append(report)
            else:
                self._dropped += 1
        self._last_seen = seen

    # -- the thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping:
            self._drain_aborts()
            self._drain_calls()
            if self.stepping:
                self._wake.wait(IDLE_WAIT_S)
                self._wake.clear()
            elif self.failure is None and self.engine.has_unfinished():
                self._step()
            elif self._held and self.failure is None:
                self._resume_held(everyone=True)
            else:
                self._resume_timed()
                self._wake.wait(IDLE_WAIT_S)
                self._wake.clear()
        self._drain_calls()

    def _step(self) -> None:
        started = time.thread_time()
        try:
            outputs = self.engine.step()
        except Exception as exc:  # the engine contains per-request failures; this is a bug
            self._stop_engine(exc)
            return
        self._dispatch(outputs)
        self.work.stepped(started)
        self._after_step()

    def step_once(self) -> int:
        """(A call, on the worker thread.) One step where there is work, its outputs
        dispatched; the engine's step count after it."""
        self._drain_aborts()
        if self.failure is None and self.engine.has_unfinished():
            self._step()
        return self.engine.step_count

    def live(self) -> list[RequestInfo]:
        """(A call.) Every request a client of this server still waits on, in order."""
        infos = (self.engine.request_info(rid) for rid in self._streams)
        return [info for info in infos if info is not None]

    def _stop_engine(self, exc: Exception) -> None:
        traceback.print_exc()
        self.failure = f"the engine stopped: a step raised {exc!r}"
        for request_id, stream in list(self._streams.items()):
            del self._streams[request_id]
            stream.put(
                Completion(
                    request_id=request_id,
                    prompt_token_ids=[],
                    token_ids=[],
                    text="",
                    finish_reason="error",
                    cached_tokens=0,
                    logprobs=[],
                    routed_experts=None,
                    error=f"internal error: {self.failure}",
                )
            )

    def _drain_aborts(self) -> None:
        while True:
            try:
                request_id = self._aborts.get_nowait()
            except queue.Empty:
                return
            self.abort_now(request_id)

    def _drain_calls(self) -> None:
        while True:
            try:
                fn, future = self._calls.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(self.work.timed("calls_s", fn))
            except BaseException as exc:  # handed to the caller
                future.set_exception(exc)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            if out.new_token_ids:
                stream.put(out)
            if out.finished:
                self._finish(out.request_id)

    def _finish(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        info = self.engine.request_info(request_id)
        if info is not None and info.done:
            params = info.params
            completion = self.engine.take(request_id)
            if self.finished is not None:
                self.finished.ended(len(completion.token_ids))
            if self.finished is not None and completion.finish_reason in ("stop", "length"):
                self.finished.add(
                    completion.prompt_token_ids, completion.token_ids, params, request_id
                )
            if stream is not None:
                stream.put(completion)
