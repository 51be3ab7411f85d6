"""Engine: the public loop of the reference engine.

    engine = Engine(EngineConfig())
    rid = engine.add_request("hello", SamplingParams(max_tokens=8))
    while engine.has_unfinished():
        for out in engine.step():
            ...                                   # streaming deltas
    completion = engine.take(rid)

One step, as the loop below reads: apply aborts, schedule (admission and
allocation, retracting under pressure), run the model, call the
``on_batch_computed`` hooks and apply the aborts that arrived while it ran,
then apply the results (commit, stop, finish).

Events (``engine.events``) are telemetry: what listeners do never changes
what the engine does. A caller that must act inside a step (a server handing
over disconnects mid-step) registers a hook instead; hooks are control, and
what they raise propagates out of ``step``.
"""

from __future__ import annotations

import itertools
import traceback
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

import torch

from kvwatch.engine.cache.backends import build_cache
from kvwatch.engine.cache.failpoints import parse_sites
from kvwatch.engine.cache.view import CacheView
from kvwatch.engine.config import MAX_ROLLBACK, EngineConfig
from kvwatch.engine.errors import (
    EngineError,
    ErrorKind,
    SessionError,
    busy_session,
    invalid_prompt,
)
from kvwatch.engine.events import (
    BatchComputed,
    EventBus,
    SessionBusy,
    SessionClosed,
    SessionOpened,
    SessionRolledBack,
)
from kvwatch.engine.faults import Fault
from kvwatch.engine.model.model import HybridModel
from kvwatch.engine.model.paged import page_layouts
from kvwatch.engine.model.tokenizer import ByteTokenizer, ChatTemplate
from kvwatch.engine.probe import EngineStats, ProbeReport, QueueReport, take_probe, take_stats
from kvwatch.engine.records import Session, SessionRegistry, Trajectory
from kvwatch.engine.request import Request, RequestOutput, SamplingParams, Status
from kvwatch.engine.runner import ModelRunner, Work, WorkResult
from kvwatch.engine.scheduler import Scheduler
from kvwatch.engine.views import (
    Completion,
    ComputedBatch,
    RequestInfo,
    SessionInfo,
    listener_finding,
    session_info_of,
)

BatchHook = Callable[[ComputedBatch], None]


class Engine:
    """The reference engine's public surface.

    Its parts (scheduler, cache, runner, request table, session registry) are
    private: callers drive it with the methods below and read it through
    ``request_info``, ``request_ids``, ``session_info``, ``session_tokens``,
    ``open_sessions``, ``probe`` and ``stats``, which hand out frozen copies,
    so nothing outside can change the engine's state behind its back.
    """

    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config = config or EngineConfig()
        if config.device.startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError(
                f"device {config.device!r} was asked for, but torch sees no CUDA device"
            )
        if config.device == "cpu" and config.cpu_threads:
            torch.set_num_threads(config.cpu_threads)
        self.events = EventBus()
        self.tokenizer = ByteTokenizer()
        self.chat_template = ChatTemplate(self.tokenizer)
        self.model = HybridModel(config.model, config.cache.window, config.device)
        self._cache = build_cache(
            config.cache,
            page_layouts(config.model),
            faults=config.faults,
            device=config.device,
            events=self.events,
            fingerprint=repr((config.model, config.cache)),
        )
        self._runner = ModelRunner(self.model, self._cache)
        self._scheduler = Scheduler(
            config.scheduler,
            self._cache,
            self.events,
            config.faults,
            config.model.max_model_len,
            branches=self._cache.branches,
        )
        self._sessions = SessionRegistry(
            keep_every_blob=Fault.SESSION_BLOB_RETENTION in config.faults,
            keep_unrun_turns=Fault.SESSION_KEEPS_UNRUN_TURN in config.faults,
            turn_ended=self._cache.end_turn,
        )
        self._requests: dict[str, Request] = {}  # live and finished, until taken
        self.step_count = 0
        self._ids = itertools.count()
        self._in_step = False
        self._aborts: list[str] = []
        self._batch_hooks: list[BatchHook] = []

    # -- the loop ------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        if self._in_step:
            raise RuntimeError("step() is not reentrant")
        self._in_step = True
        try:
            self._apply_aborts()
            works = self._scheduler.schedule(self.step_count)
            results = self._run(works)
            if works:
                self._between_phases(works)
            outputs = self._scheduler.update(works, results)
            self.step_count += 1
            return outputs
        finally:
            self._in_step = False

    def _between_phases(self, works: list[Work]) -> None:
        """After the forward, before its results are applied: telemetry, then the
        hooks, then the aborts they (or other threads, through them) asked for."""
        ids = tuple(w.request.id for w in works)
        tokens = sum(w.n + len(w.drafts) for w in works)
        self.events.emit(BatchComputed(self.step_count, ids, tokens))
        batch = ComputedBatch(self.step_count, ids, tuple(len(w.drafts) for w in works))
        for hook in tuple(self._batch_hooks):
            hook(batch)  # control: what it raises leaves the step
        self._apply_aborts()  # disconnects that arrived while the batch ran

    def on_batch_computed(self, hook: BatchHook) -> Callable[[], None]:
        """Call ``hook(batch)`` in every step that computed a batch, after the
        forward and before its results are applied; returns the hook's removal.

        Unlike an event handler, a hook is control: it may abort requests (they
        are aborted at that point, mid-prefill, mid-decode or mid-verify), and
        what it raises propagates out of ``step``. Hooks run in the order added.
        """
        self._batch_hooks.append(hook)
        return lambda: self._batch_hooks.remove(hook)

    @property
    def in_step(self) -> bool:
        """True while ``step`` runs: hooks and event handlers run inside it, and aborts are deferred."""
        return self._in_step

    def _run(self, works: list[Work]) -> list[WorkResult | None]:
        """Run the batch; if it raises, run each piece alone so only the failing ones fail.

        A failed request gets ``None`` and an error; the others get exactly the
        result the batch would have given them: the model is batch-invariant,
        re-writing a piece's K/V writes the same values, and every sampler
        generator is put back to where it stood before the batch.
        """
        if not works:
            return []
        rngs = [w.request.generator and w.request.generator.get_state() for w in works]
        try:
            return self._runner.run(works)
        except Exception as exc:  # one bad request must not take the loop down
            if len(works) == 1:
                return [self._runner_failed(works[0], exc)]
        results: list[WorkResult | None] = []
        for w, rng in zip(works, rngs, strict=True):
            if rng is None:
                w.request.generator = None
            else:
                w.request.generator.set_state(rng)
            try:
                results.append(self._runner.run([w])[0])
            except Exception as exc:
                results.append(self._runner_failed(w, exc))
        return results

    def _runner_failed(self, work: Work, exc: Exception) -> None:
        traceback.print_exception(exc)
        self._scheduler.fail(work.request, f"internal error in the model runner: {exc!r}")

    def _apply_aborts(self) -> None:
        pending, self._aborts = self._aborts, []
        for rid in pending:
            req = self._requests.get(rid)
            if req is not None and not req.done:
                self._scheduler.abort(req)

    # -- requests ------------------------------------------------------------------------
    def add_request(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        extra_key: str | None = None,
        session_id: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> str:
        """Queue a prompt (text or token ids); returns its request id.

        With ``session_id`` the prompt is the session's next turn: it must
        start with every token of the session so far and add at least one.
        A turn that ends before it is ever admitted (aborted or failed while
        queued) leaves the session as it was (``Session.end_turn``).
        ``labels`` ride along on the ``RequestAdded`` event for subscribers.
        """
        tokens = self._prompt_tokens(prompt)
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self._requests:
            raise EngineError(
                f"request id {rid!r} is already in use",
                kind=ErrorKind.CONFLICT,
                code="request_id_in_use",
            )
        session = None
        if session_id is not None:
            session = self._sessions.begin_turn(session_id, tokens)
            session.start_turn(rid, tokens)
            tokens = session.tokens
        params = params or SamplingParams()
        req = Request(
            id=rid,
            tokens=tokens,
            prompt_len=len(tokens),
            params=params,
            arrival=self.step_count,
            extra_key=extra_key,
            session=session,
        )
        req.labels = tuple((str(k), str(v)) for k, v in (labels or {}).items())
        self._requests[rid] = req
        self._scheduler.add(req)
        return rid

    def _prompt_tokens(self, prompt: str | Sequence[int]) -> list[int]:
        """The prompt as token ids; an ``invalid_prompt`` error if the model cannot take it."""
        try:
            tokens = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        except ValueError as exc:  # text that is not valid Unicode
            raise invalid_prompt(str(exc)) from None
        if not tokens:
            raise invalid_prompt("the prompt is empty")
        if any(not isinstance(t, int) or not 0 <= t < self.model.vocab_size for t in tokens):
            raise invalid_prompt(f"token ids must be integers in [0, {self.model.vocab_size})")
        if len(tokens) >= self.config.model.max_model_len:
            raise invalid_prompt(
                f"the prompt has {len(tokens)} tokens; max_model_len is {self.config.model.max_model_len}"
            )
        return tokens

    def abort(self, request_id: str) -> bool:
        """Abort a request at whatever stage it is; inside a step, at the next safe point."""
        req = self._requests.get(request_id)
        if req is None or req.done:
            return False
        self._aborts.append(request_id)
        if not self._in_step:
            self._apply_aborts()
        return True

    def pause(self, request_id: str) -> None:
        self._control(request_id, self._scheduler.pause)

    def resume(self, request_id: str) -> None:
        self._control(request_id, self._scheduler.resume)

    def retract(self, request_id: str, *, hold_steps: int | None = None) -> None:
        """Push a running request out of the cache now, as pool pressure would; it
        waits ``hold_steps`` steps (default: the scheduler's backoff) on the host tier."""
        self._control(request_id, self._scheduler.retract, hold_steps)

    def _control(self, request_id: str, action, *args) -> None:
        if self._in_step:
            raise RuntimeError("pause, resume and retract apply between steps")
        action(self._requests[request_id], *args)

    def request_info(self, request_id: str) -> RequestInfo | None:
        """A request the engine holds (live, or ended and not yet taken); None otherwise."""
        req = self._requests.get(request_id)
        if req is None:
            return None
        return RequestInfo(
            request_id=req.id,
            status=req.status,
            params=req.params,
            prompt_tokens=req.prompt_len,
            output_tokens=len(req.output_ids),
            cached_tokens=req.cached_tokens,
            session_id=req.session.id if req.session is not None else None,
        )

    def request_ids(self, *statuses: Status) -> tuple[str, ...]:
        """The ids of the requests the engine holds, in arrival order; only those in
        one of ``statuses`` when any are given."""
        return tuple(
            rid for rid, req in self._requests.items() if not statuses or req.status in statuses
        )

    def computed_beyond_cache(self, request_id: str) -> int | None:
        """Prompt and output tokens a running request computed past the prefix it
        found cached when first admitted; None unless it runs now."""
        req = self._requests.get(request_id)
        if req is None or req.status is not Status.RUNNING or req.holder is None:
            return None
        return req.holder.computed_len - req.cached_tokens

    # -- sessions ------------------------------------------------------------------------
    def open_session(
        self, session_id: str | None = None, *, record: bool = False, routed_experts: bool = False
    ) -> str:
        """A streaming session: its turns keep one cache slot; with ``record``, each
        finished turn leaves a record (and its routed-expert blob with ``routed_experts``)."""
        sid = self._sessions.create(session_id, record=record, routed_experts=routed_experts).id
        self.events.emit(SessionOpened(sid))
        return sid

    def close_session(self, session_id: str, *, reason: str = "closed") -> None:
        """Insert the session's tokens into the tree and give its slot back.

        The session is closed even when its cache state is broken (an injected
        fault, say) and giving the slot back raises: the slot is then left as
        it is, for the probe's audit to report what it still holds.
        """
        action = "idle timeout" if reason == "idle timeout" else "close"
        session = self._idle_session(session_id, action)
        self._sessions.forget(session)
        self.events.emit(SessionClosed(session_id, reason))
        if session.holder is None:
            return
        try:
            self._cache.release(session.holder, commit=True)
        except Exception:
            traceback.print_exc()

    def rollback_session(self, session_id: str, steps: int = 1) -> None:
        """Undo the last ``steps`` turns (at most MAX_ROLLBACK); nothing changes on error."""
        session = self._idle_session(session_id, "rollback")
        if session.records is not None:
            session.records.check_rollback(steps)
        elif not 1 <= steps <= min(MAX_ROLLBACK, len(session.turn_ends) - 1):
            raise SessionError(
                f"session {session_id!r} can roll back 1 to "
                f"{min(MAX_ROLLBACK, len(session.turn_ends) - 1)} steps, not {steps}",
                code="rollback_out_of_range",
            )
        del session.tokens[session.turn_ends[-1 - steps] :]
        del session.turn_ends[-steps:]
        if session.records is not None:
            session.records.rollback(steps)
        if session.holder is not None:  # the slot's state must not outrun its tokens
            self._cache.settle(session.holder, len(session.tokens))
        self.events.emit(SessionRolledBack(session_id, steps))

    def session_info(self, session_id: str) -> SessionInfo:
        """An open session; a ``SessionError`` if it is unknown or closed."""
        return session_info_of(self._sessions.get(session_id))

    def session_tokens(self, session_id: str) -> tuple[int, ...]:
        """An open session's tokens so far (its next turn must start with them)."""
        return tuple(self._sessions.get(session_id).tokens)

    def open_sessions(self) -> Mapping[str, SessionInfo]:
        """Every open session by id, in the order they were opened (a read-only copy)."""
        return MappingProxyType({sid: session_info_of(s) for sid, s in self._sessions.open.items()})

    def trajectory(self, session_id: str) -> Trajectory:
        session = self._sessions.get(session_id)
        if session.records is None:
            raise SessionError(
                f"session {session_id!r} was opened without recording", code="session_not_recorded"
            )
        return session.records.merge(session.tokens)

    def _idle_session(self, session_id: str, action: str) -> Session:
        """The session, with no turn in flight; a refused ``action`` (``close``,
        ``rollback``, ``idle timeout``) is a ``SessionBusy`` event, then the error."""
        if self._in_step:
            raise RuntimeError("sessions change between steps")
        session = self._sessions.get(session_id)
        if session.in_flight is not None:
            self.events.emit(SessionBusy(session_id, action, session.in_flight))
            raise busy_session(session_id)
        return session

    def has_unfinished(self) -> bool:
        return self._scheduler.has_work

    def take(self, request_id: str) -> Completion:
        """The result of a finished, aborted or failed request; the engine forgets it."""
        req = self._requests[request_id]
        if not req.done:
            raise ValueError(f"request {request_id!r} is still {req.status}")
        del self._requests[request_id]
        return Completion(
            request_id=req.id,
            prompt_token_ids=req.tokens[: req.prompt_len],
            token_ids=req.output_ids,
            text=self.tokenizer.decode(req.output_ids),
            finish_reason=req.finish_reason,
            cached_tokens=req.cached_tokens,
            logprobs=req.logprobs,
            routed_experts=req.routed_experts,
            error=req.error,
        )

    def generate(
        self, prompts: Sequence[str | Sequence[int]], params: SamplingParams | None = None
    ) -> list[Completion]:
        """Run prompts to completion together (continuous batching) and return them in order."""
        ids = [self.add_request(p, params) for p in prompts]
        while any(not self._requests[rid].done for rid in ids):
            self.step()
        return [self.take(rid) for rid in ids]

    # -- observation ---------------------------------------------------------------------
    @property
    def cache_view(self) -> CacheView:
        """The cache, read-only (tree, pools, holders): for readers between steps."""
        return self._cache.view

    def probe(self) -> ProbeReport:
        """The full report at a step boundary: usage, audit findings, bounds.

        Event handlers that raised since the engine was built (the bus isolates
        them, so nothing else would show it) add one ``listener`` finding.
        """
        spec = self.config.scheduler.spec
        report = take_probe(
            self._cache.reads,
            self.step_count,
            self._queue(),
            slack_tokens=spec.num_drafts + 1 if spec else 0,
            live_sessions=len(self._sessions.open),
            record_bytes=self._sessions.blob_bytes,
            sessions_closed=self._sessions.closed_total,
        )
        if listener := listener_finding(self.events.failures):
            report = report._replace(findings=(*report.findings, listener))
        return report

    def stats(self) -> EngineStats:
        """Usage, tree and queue figures without the audit: cheap, for gauges."""
        return take_stats(
            self._cache.reads,
            self.step_count,
            self._queue(),
            live_sessions=len(self._sessions.open),
            record_bytes=self._sessions.blob_bytes,
            sessions_closed=self._sessions.closed_total,
        )

    def arm_failpoints(self, armed: bool) -> None:
        """With ``CacheConfig.failpoints`` set, make the cache's sites count and fail
        (True, as it starts) or neither (False); between steps."""
        if self._in_step:
            raise RuntimeError("failpoints are armed between steps")
        self._cache.failpoints.arm(armed)

    def fail_next(self, site: str) -> None:
        """Make the cache's next hit of failpoint ``site`` (``failpoints.Site``, e.g.
        ``tier.load``) fail as a full pool would fail it; between steps."""
        if self._in_step:
            raise RuntimeError("a failpoint is set between steps")
        (named,) = parse_sites([site])  # ValueError naming the sites there are
        self._cache.failpoints.fail_next(named)

    def flush_cache(self) -> None:
        """Evict every unreferenced node, snapshot and slot."""
        if self._in_step:
            raise RuntimeError("the cache is flushed between steps")
        self._cache.flush()

    def _queue(self) -> QueueReport:
        if self._in_step:
            raise RuntimeError("probes are taken between steps")
        s = self._scheduler
        retracted = sum(r.status is Status.RETRACTED for r in s.waiting)
        return QueueReport(
            waiting=len(s.waiting) - retracted,
            running=len(s.running),
            retracted=retracted,
            paused=len(s.paused),
        )
