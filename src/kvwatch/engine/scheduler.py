"""Scheduler: continuous batching with chunked prefill, speculative steps and retraction.

Each step, oldest request first:

1. every running request gets its next piece: a prefill chunk while more than
   one of its tokens is uncomputed, else one decode token, or a verify step
   of the last token plus k drafts (greedy requests, ``spec`` on);
2. queued requests are admitted (matched against the cache) while slots,
   token budget and pages allow. One that shares a prefix with a request
   still computing it waits, and resumes where it branches off
   (prefix_wait.py).

A piece that cannot get pages has already made the cache evict and prune.
Then drafts are dropped, then the newest running request is retracted, then
retracted requests give up their recovery points (which pin tree pages), and
only a request that cannot fit even alone fails, with a clear error. The
loop itself never stops on a shortage. A retracted request waits
``retract_backoff`` steps before it is admitted again, so the pressure that
pushed it out can clear instead of pushing it out again at once.
"""

from __future__ import annotations

import bisect
from collections import deque

from kvwatch.engine.cache.holder import HolderStatus
from kvwatch.engine.cache.owner import OwnerKind
from kvwatch.engine.cache.pool import PoolExhausted
from kvwatch.engine.cache.protocol import BranchPromises, Capture, Match, PrefixCache
from kvwatch.engine.config import SchedulerConfig
from kvwatch.engine.events import (
    EventBus,
    PrefillChunk,
    RequestAborted,
    RequestAdded,
    RequestFailed,
    RequestFinished,
    RequestPaused,
    RequestRecovered,
    RequestRetracted,
    RequestScheduled,
    RequestWaiting,
    SpecVerified,
    TokensGenerated,
)
from kvwatch.engine.faults import Fault
from kvwatch.engine.model.paged import EXPERTS
from kvwatch.engine.model.tokenizer import last_turn_start
from kvwatch.engine.paths import path_key, prompt_key
from kvwatch.engine.prefix_wait import PrefixWaits
from kvwatch.engine.request import Request, RequestOutput, Status
from kvwatch.engine.runner import Work, WorkResult
from kvwatch.engine.spec import propose


class Scheduler:
    def __init__(
        self,
        cfg: SchedulerConfig,
        cache: PrefixCache,
        events: EventBus,
        faults: frozenset[Fault],
        max_model_len: int,
        branches: BranchPromises,
    ) -> None:
        """``cache`` takes a request's pages; ``branches`` (the same backend, seen
        through its prefix-wait capability) the step's promised branch points."""
        self.cfg, self.cache, self.events, self.faults = cfg, cache, events, faults
        self.branches = branches
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # by arrival, oldest first
        self.paused: dict[str, Request] = {}
        self.in_flight: dict[str, Work] = {}  # the current step's work, until update()
        self.outputs: list[RequestOutput] = []  # failures and aborts, for the next step's return
        self.step = 0

    @property
    def has_work(self) -> bool:
        """Requests to run, or outputs to hand over: an abort between steps leaves
        its output for the next step, which an idle loop would never take."""
        return bool(self.waiting or self.running or self.outputs)

    # -- intake and control ------------------------------------------------------------
    def add(self, req: Request) -> None:
        self.waiting.append(req)
        session_id = req.session.id if req.session is not None else None
        self.events.emit(
            RequestAdded(
                request_id=req.id,
                prompt_tokens=req.prompt_len,
                step=self.step,
                session_id=session_id,
                labels=req.labels,
                path_key=path_key(req.tokens, req.extra_key, self.cache.page_size),
                prompt_key=prompt_key(req.tokens, req.extra_key),
            )
        )

    def abort(self, req: Request) -> None:
        stage = self._stage(req)
        self._let_go(req, commit=False)
        req.status = Status.ABORTED
        req.finish_reason = "abort"
        if req.session is not None:
            req.session.end_turn(req, record=False)
        self.events.emit(RequestAborted(req.id, stage))
        self.outputs.append(
            RequestOutput(request_id=req.id, new_token_ids=(), finished=True, finish_reason="abort")
        )
        self._drop_promises_without_waiters()

    def pause(self, req: Request) -> None:
        """Release without committing; the request waits for ``resume``."""
        if req.status is Status.PAUSED or req.done:
            return
        self._let_go(req, commit=False)
        req.status = Status.PAUSED
        self.paused[req.id] = req
        self.events.emit(RequestPaused(req.id))

    def resume(self, req: Request) -> None:
        if self.paused.pop(req.id, None) is not None:
            req.status = Status.WAITING
            self.waiting.appendleft(req)

    def retract(self, req: Request, hold_steps: int | None = None) -> None:
        """Push a running request out now; it waits ``hold_steps`` steps (default:
        ``retract_backoff``) before it is admitted again."""
        if req.status is Status.RUNNING:
            self._retract(req, hold_steps)

    def _forced_retract(self, works: dict[str, Work]) -> None:
        """``retract_every``: after placing this step's work, push one request out
        the way pool pressure does in ``_place`` (its pages for this step already
        allocated): the newest still in prefill, else the newest. One runs on."""
        placed = [r for r in self.running if r.id in works]
        if len(placed) < 2:
            return
        prefilling = [r for r in placed if r.holder.computed_len < r.prompt_len - 1]
        victim = (prefilling or placed)[-1]
        work = works.pop(victim.id)
        self._retract(victim, stage="verify" if work.drafts else None)

    # -- one step ----------------------------------------------------------------------
    def schedule(self, step: int) -> list[Work]:
        self.step = step
        works: dict[str, Work] = {}
        budget = self.cfg.max_batch_tokens
        for req in list(self.running):
            if budget <= 0:
                break
            if req.status is Status.RUNNING and (work := self._try_place(req, budget, works)):
                works[req.id] = work
                budget -= work.n + len(work.drafts)
        waits = (
            PrefixWaits(self.branches, self.cache.page_size, self.running)
            if self.cfg.prefix_waits
            else None
        )
        for req in list(self.waiting):
            if len(self.running) >= self.cfg.max_running or budget <= 0:
                break
            if req.not_before > step:
                continue  # backing off after a retraction
            if waits is not None and waits.waits(req):
                if not req.waiting_for_prefix:
                    req.waiting_for_prefix = True
                    self.events.emit(RequestWaiting(req.id, step))
                continue  # waiting for a sharer
            try:
                admitted = self._admit(req)
            except Exception as exc:  # a cache broken past repair (an injected fault, say)
                self._fail_hard(req, f"internal error while admitting the request: {exc!r}")
                continue
            if not admitted:
                if req.done:  # it can never fit: failed, try the next one
                    continue
                break
            work = self._try_place(req, budget, works)
            if work is None:
                if req.done:  # it failed alone: try the next one
                    continue
                break  # it stepped back: the cache is full for now
            works[req.id] = work
            budget -= work.n + len(work.drafts)
            if waits is not None:
                waits.admitted(req)
        if waits is not None:
            for req in self.waiting:  # all of them: a wait stands while the batch is full too
                waits.waits(req)
            self.branches.promise(waits.promises, waits.wanted)
        every = self.cfg.retract_every
        if every and step % every == every - 1:
            self._forced_retract(works)
        self.in_flight = works
        return list(works.values())

    def update(self, works: list[Work], results: list[WorkResult | None]) -> list[RequestOutput]:
        """Apply each request's result; one whose result cannot be applied fails alone."""
        applied = []
        for work, res in zip(works, results, strict=True):
            req = work.request
            if req.status is not Status.RUNNING:  # aborted or failed while the batch ran
                continue
            try:
                applied.append(self._apply(work, res))
            except Exception as exc:  # a cache broken past repair (an injected fault, say)
                self._fail_hard(req, f"internal error while applying the step: {exc!r}")
        self.in_flight = {}
        self._drop_promises_without_waiters()
        outputs, self.outputs = self.outputs, []
        return outputs + applied

    def _drop_promises_without_waiters(self) -> None:
        """With the queue empty no one waits to branch off: what was kept for
        waiters goes now, not at the next step (an idle engine takes none)."""
        if not self.waiting and self.branches.keeps_for_waiters():
            self.branches.promise({}, set())

    def _apply(self, work: Work, res: WorkResult) -> RequestOutput:
        req, h = work.request, work.request.holder
        kept, reason = req.accept(res.new_tokens, self.max_model_len)
        first = not req.output_ids
        req.tokens.extend(kept)  # before commit: the tree is keyed by these tokens
        req.logprobs.extend(res.logprobs[: len(kept)])
        # The last token always waits to be computed: it yields the next logits.
        computed_to = min(res.computed_to, len(req.tokens) - 1)
        self.cache.set_working_state(h, res.states[computed_to])
        captures = [
            Capture(b, kind, res.states[b])
            for b, kind in self.cache.capture_points(h, work.start, computed_to)
            if b in res.states
        ]
        self.cache.advance(h, computed_to, captures)
        if work.drafts:
            self.events.emit(SpecVerified(req.id, len(work.drafts), len(res.new_tokens) - 1))
            # A finishing request gives everything back (a session frees the tail
            # when it resumes), so only a continuing one trims rejected slots.
            if not reason and Fault.SPEC_OVERALLOC_LEAK not in self.faults:
                self.cache.trim(h, computed_to)
        self.cache.commit_chunk(h)
        if work.n > 1 or work.start < req.prompt_len:
            self.events.emit(
                PrefillChunk(request_id=req.id, start=work.start, tokens=work.n, step=self.step)
            )
        if kept:
            self.events.emit(
                TokensGenerated(request_id=req.id, count=len(kept), first=first, step=self.step)
            )
        if reason:
            self._finish(req, reason)
        return RequestOutput(
            request_id=req.id,
            new_token_ids=tuple(kept),
            finished=req.done,
            finish_reason=req.finish_reason,
        )

    # -- placing work ------------------------------------------------------------------
    def _plan(self, req: Request, budget: int) -> tuple[int, tuple[int, ...]]:
        remaining = len(req.tokens) - req.holder.computed_len
        if remaining > 1:
            return min(remaining, self.cfg.chunk_size, budget), ()
        spec = self.cfg.spec
        if spec is None or not req.params.greedy:
            return 1, ()
        k = min(
            spec.num_drafts,
            req.params.max_tokens - len(req.output_ids) - 1,
            self.max_model_len - len(req.tokens) - 1,
            budget - 1,
        )
        return 1, propose(req.tokens, k, spec.min_ngram, spec.max_ngram)

    def _try_place(self, req: Request, budget: int, works: dict[str, Work]) -> Work | None:
        """``_place``, but an unexpected error fails this request alone (``None``, done)."""
        try:
            return self._place(req, budget, works)
        except Exception as exc:  # a cache broken past repair (an injected fault, say)
            self._fail_hard(req, f"internal error while allocating for the request: {exc!r}")
            return None

    def _place(self, req: Request, budget: int, works: dict[str, Work]) -> Work | None:
        """Allocate the request's next piece, making room as the module docstring says."""
        n, drafts = self._plan(req, budget)
        while True:
            try:
                self.cache.allocate(req.holder, n + len(drafts))
                return Work(request=req, start=req.holder.computed_len, n=n, drafts=drafts)
            except PoolExhausted as exc:
                if drafts:
                    drafts = ()
                    continue
                victim = self.running[-1]
                if victim is not req:
                    works.pop(victim.id, None)
                    self._retract(victim)
                    continue
                if len(self.running) > 1:
                    self._retract(req)  # the newest steps back for older requests
                elif self._unpin():
                    continue
                else:
                    self.fail(req, f"request needs more pages than the cache can free: {exc}")
                return None

    def _admit(self, req: Request) -> bool:
        """Match the head of the queue against the cache (or resume its session slot)."""
        session = req.session
        if req.holder is None and session is not None and session.holder is not None:
            req.holder = session.holder
        if req.holder is None:
            kind = OwnerKind.SESSION if session else OwnerKind.REQUEST
            req.holder = self.cache.open(
                req.tokens,
                extra_key=req.extra_key,
                kind=kind,
                snapshot_at=last_turn_start(req.tokens[: req.prompt_len]),
                label=session.id if session else req.id,
            )
            if session is not None:
                session.holder = req.holder
        match = None
        if req.holder.status is HolderStatus.PARKED:
            resumed = self.cache.resume(req.holder)  # None: the slot starts over
            match = Match(resumed, resumed) if resumed is not None else None
        try:
            match = match or self.cache.match(req.holder)
        except PoolExhausted as exc:
            if not self.running and not self._unpin():  # nothing will free pages
                self.fail(req, f"request cannot be admitted even into an idle cache: {exc}")
            return False
        self.waiting.remove(req)
        req.status, req.waiting_for_prefix = Status.RUNNING, False
        bisect.insort(self.running, req, key=lambda r: r.arrival)
        if req.admitted:  # retracted or paused before: it recomputes what it gave up
            self.events.emit(RequestRecovered(req.id, match.resume_len))
        else:
            req.cached_tokens = min(match.resume_len, req.prompt_len)
            hit = min(match.hit_len, req.prompt_len)
            scheduled = RequestScheduled(
                request_id=req.id,
                step=self.step,
                hit_tokens=hit,
                cached_tokens=req.cached_tokens,
                holder_id=req.holder.id,
                branch_tokens=min(_branch(match), req.prompt_len),
            )
            self.events.emit(scheduled)
        req.admitted = True
        return True

    # -- leaving -----------------------------------------------------------------------
    def _finish(self, req: Request, reason: str) -> None:
        if req.params.return_routed_experts or (req.session and req.session.routed_experts):
            req.routed_experts = self.cache.read_aux(req.holder, EXPERTS)
        self._let_go(req, commit=True)
        req.status, req.finish_reason = Status.FINISHED, reason
        if req.session is not None:
            req.session.end_turn(req, record=True)
        self.events.emit(
            RequestFinished(
                request_id=req.id,
                reason=reason,
                prompt_tokens=req.prompt_len,
                output_tokens=len(req.output_ids),
                cached_tokens=req.cached_tokens,
            )
        )

    def fail(self, req: Request, error: str) -> None:
        """End a request with an error; the loop and every other request go on."""
        self._let_go(req, commit=False)
        self._failed(req, error)

    def _failed(self, req: Request, error: str) -> None:
        req.status, req.error, req.finish_reason = Status.FAILED, error, "error"
        if req.session is not None:
            req.session.end_turn(req, record=False)
        self.events.emit(RequestFailed(req.id, error))
        self.outputs.append(
            RequestOutput(
                request_id=req.id,
                new_token_ids=(),
                finished=True,
                finish_reason="error",
                error=error,
            )
        )

    def _fail_hard(self, req: Request, error: str) -> None:
        """``fail`` for a request whose cache state cannot be trusted: if giving its
        holder back raises too, the holder is left where it is (the audit then
        reports what it still holds) and only the request and its turn end."""
        try:
            self._let_go(req, commit=False)
        except Exception:
            for queue in (self.waiting, self.running):
                if req in queue:
                    queue.remove(req)
        self._failed(req, error)

    def _retract(
        self, req: Request, hold_steps: int | None = None, stage: str | None = None
    ) -> None:
        """``stage``: what the request was about to do when pushed out (default: what
        it did last), for the ``RequestRetracted`` event."""
        computed, stage = req.holder.computed_len, stage or self._stage(req)
        if req.session is not None:  # a session slot is pinned: the turn steps back, the slot stays
            self.cache.park(req.holder)
            req.holder = None
        else:
            self.cache.retract(req.holder)
        self.running.remove(req)
        req.status = Status.RETRACTED
        hold = self.cfg.retract_backoff if hold_steps is None else hold_steps
        req.not_before = self.step + 1 + hold
        self.waiting.appendleft(req)
        self.events.emit(RequestRetracted(req.id, computed, stage))

    def _unpin(self) -> bool:
        """Give up one thing that pins pages nobody is computing with; False if none.

        A retracted request's host ref keeps its path in the tree, and a
        session's parked slot keeps its pages, so a few of them can pin a pool
        that any one request would fit in alone. Before a request fails for
        want of pages they let go one at a time: first the newest retracted
        request's recovery point (it is admitted again like a new request),
        then a parked slot (its session's next turn recomputes from the tree).
        Only what does pin counts: a queued request's holder that keeps no
        recovery point (opened by an admission that failed, or retracted with
        nothing to recover from) frees nothing, and counting it as unpinned
        would have the head of the queue retry forever, failing nothing.
        """
        for req in reversed(self.waiting):
            if req.session is None and req.holder is not None and req.holder.keeps_recovery:
                self.cache.release(req.holder, commit=False)
                req.holder = None
                return True
        return self.cache.drop_parked()

    def _let_go(self, req: Request, *, commit: bool) -> None:
        """Take the request out of every queue and give its cache holder back."""
        if req in self.running:
            self.running.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        self.paused.pop(req.id, None)
        self.in_flight.pop(req.id, None)
        if req.holder is None:
            return
        if req.session is not None:  # the session keeps its slot between turns
            if req.holder.status is HolderStatus.ACTIVE:
                self.cache.park(req.holder)
        else:
            self.cache.release(req.holder, commit=commit)
        req.holder = None

    def _stage(self, req: Request) -> str:
        if req.status is Status.RUNNING:
            if (work := self.in_flight.get(req.id)) and work.drafts:
                return "verify"
            return "prefill" if len(req.tokens) - req.holder.computed_len > 1 else "decode"
        return {Status.RETRACTED: "retracted", Status.PAUSED: "paused"}.get(req.status, "queued")


def _branch(match: Match) -> int:
    """Where the prompt parts from the cache, to the token (``Match.branch_len``)."""
    return match.hit_len if match.branch_len is None else match.branch_len
