"""``SchedulerLoop``: the release's own ``Scheduler`` as an ``EngineLoop`` (``../driver``).

``SchedulerLoop(release, config)`` builds the release's ``Scheduler``
(``scheduler_setup.build``) and steps its own event loop
(``paced_loop.PacedLoop``): one ``step()`` is one iteration of the loop as
SGLang ships it, the virtual clock one second on. The clients' side is
messages, as the tokenizer manager sends them (``messages.py``): ``submit``
queues a ``TokenizedGenerateReqInput``, ``abort`` an ``AbortReq``,
``open_session`` / ``close_session`` their requests; the scheduler takes them
at its next ``recv_requests``. What the scheduler sends back (its outputs to
the tokenizer and detokenizer) becomes ``outcomes``: finished, aborted by the
client (in the queue or running), timed out, rejected by design (queue full,
a higher priority), or aborted by SGLang unasked. ``flush`` evicts everything
evictable through the release's own ``tree.evict`` (never ``reset()``), as
kvwatch's ``POST /debug/flush_cache`` does.

``submit`` returns a ``RequestHandle``: SGLang's own ``Req`` once the
scheduler made it (noted where it queues it, ``_add_request_to_queue``), the
message's tokens until then. The queue, batches, tree cache and session
controller the probe reads are the scheduler's own attributes; the pools are
the worker's, the release's classes. After every step the admission watch
(``admission_watch.py``) says whether the scheduler stopped admitting
(``stalled``, ``checks``), then the observers run (the probe).

Invariant: the loop changes SGLang's state only through the messages a
tokenizer manager would send and the release's own eviction; everything else
here reads.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any

from kvwatch.contracts import Finding
from kvwatch.targets.driver.engine_loop import EngineLoop, Outcome
from kvwatch.targets.sglang import messages, scheduler_host, scheduler_imports, scheduler_setup
from kvwatch.targets.sglang.admission_watch import AdmissionWatch
from kvwatch.targets.sglang.cache_views import inner
from kvwatch.targets.sglang.loop_parts import (
    ABORTED,
    ABORTED_BY_SGLANG,
    ABORTED_IN_QUEUE,
    FINISHED,
    ON_PURPOSE,
    REJECTED,
    TIMED_OUT,
    LoopConfig,
    call_offered,
)
from kvwatch.targets.sglang.messages import RequestHandle
from kvwatch.targets.sglang.paced_loop import PacedLoop
from kvwatch.targets.sglang.pool_holders import KV, MAMBA, SWA, PoolReader
from kvwatch.targets.sglang.release_import import Release
from kvwatch.targets.sglang.stand_in_worker import TokenModel

TIMEOUT_WORDS = ("waiting timeout",)  # _abort_on_waiting_timeout's message
# _abort_on_queued_limit's messages, the session controller's refusals of a turn it
# cannot take (a turn while one is active, an unknown or closing session, an unfinished
# parent) and the scheduler's of a prompt longer than the context
REJECT_WORDS = ("queue is full", "higher priority", "active request", "invalid request session")
REJECT_WORDS += ("hasn't finished", "does not exist", "close was requested")
REJECT_WORDS += ("exceeds the maximum allowed length",)  # a prompt longer than the context


def environment(config: LoopConfig) -> dict[str, str]:
    """The environment SGLang reads for ``config`` while the run lasts."""
    return {"SGLANG_REQ_WAITING_TIMEOUT": str(config.waiting_timeout_steps or 0)}


class SchedulerLoop(EngineLoop):
    engine = "SGLang"
    on_purpose = ON_PURPOSE
    unasked = ABORTED_BY_SGLANG

    def __init__(
        self, release: Release, config: LoopConfig, seed: int = 0, model: TokenModel | None = None
    ) -> None:
        super().__init__()
        self.config, self.seed, self.step_no = config, seed, 0
        self.asked_aborts: list[str] = []  # rid prefixes the client asked to abort
        self.watch = AdmissionWatch()  # does the scheduler still admit?
        self.release = release
        self.sb = release.module("schedule_batch")
        self.io = importlib.import_module("sglang.srt.managers.io_struct")
        self.model = model or TokenModel(seed)
        self.clock = scheduler_host.Clock()
        scheduler_imports.OWN_REPORTS.clear()
        self.sched, self.worker = scheduler_setup.build(release, config, self.clock, self.model)
        self.pools = self.worker.pools
        self.handles: dict[str, RequestHandle] = {}
        self.ran: set[str] = set()  # requests seen in a batch
        self.first_input: dict[str, tuple[int, ...]] = {}  # their input when first seen there
        self.where_asked: dict[str, str] = {}  # rid -> "queue" or "running" at its abort
        self.read_upto: dict[int, int] = {}  # id(outbox) -> messages read
        self.array_ids = messages.tokenizer_sends_arrays(release)
        self._note_queued()
        self.loop = PacedLoop(self.sched, overlap=config.overlap)
        self.capacity = _capacity(PoolReader(self))  # units per pool, all free now

    @property
    def steps(self) -> int:
        return self.step_no

    # -- the scheduler's structures, as the probe reads them -------------------------------
    @property
    def waiting_queue(self) -> list[Any]:
        return self.sched.waiting_queue

    @property
    def running_batch(self) -> Any:
        return self.sched.running_batch

    @property
    def last_batch(self) -> Any:
        return self.sched.last_batch

    @property
    def chunked_req(self) -> Any:
        return self.sched.chunked_req

    @property
    def tree_cache(self) -> Any:
        return self.sched.tree_cache

    @property
    def sessions(self) -> Any:
        """The session registry: ``SessionController`` (0.5.10+) or the dict before."""
        controller = getattr(self.sched, "session_controller", None)
        if controller is not None:
            return controller
        return SimpleNamespace(sessions=self.sched.sessions)

    @property
    def inbox(self) -> scheduler_host.InQueue:
        return self.sched.kvwatch_inbox

    def own_reports(self) -> list[str]:
        """What SGLang's own memory checks reported during the run."""
        return list(scheduler_imports.OWN_REPORTS)

    def running_requests(self) -> list[Any]:
        """Requests in a batch (running, the last prefill batch, the chunked one)."""
        seen, out = set(), []
        extra = self.last_batch.reqs if self.last_batch is not None else []
        chunked = [self.chunked_req] if self.chunked_req is not None else []
        for req in [*self.running_batch.reqs, *extra, *chunked]:
            if id(req) not in seen and not req.finished():
                seen.add(id(req))
                out.append(req)
        return out

    def live_requests(self) -> list[Any]:
        return [*self.waiting_queue, *self.running_requests()]

    def live_rids(self) -> list[str]:
        return [req.rid for req in self.live_requests()]

    def idle(self) -> bool:
        return not self.inbox.messages and not self.live_requests()

    def session_open(self, session_id: str) -> bool:
        """Whether SGLang's session controller still holds ``session_id``."""
        sessions: Any = self.sessions
        return sessions is not None and session_id in sessions.sessions

    def stalled(self) -> bool:
        """Whether the scheduler stopped admitting with requests waiting."""
        return self.watch.stalled

    # -- what the history tier reads ------------------------------------------------------
    def stage(self, rid: Any) -> str | None:
        """``queued`` or ``retracted`` (in the waiting queue), ``prefilling`` or
        ``decoding`` (in a batch); None once it ended or before the scheduler has it."""
        for req in self.waiting_queue:
            if req.rid == rid:
                return "retracted" if getattr(req, "is_retracted", False) else "queued"
        for req in self.running_requests():
            if req.rid == rid:
                return "decoding" if req.output_ids else "prefilling"
        return None

    def admitted(self, rid: Any) -> bool:
        """Whether a step computed the request's own input (see ``step``)."""
        return rid in self.ran

    def input_of(self, rid: Any) -> tuple[int, ...] | None:
        """The request's ``origin_input_ids`` when a batch first held it (a session turn's:
        the session's tokens and its own, as the session controller built them); as they
        are now for one never run. SGLang's abort path rewrites them to ``[0]``."""
        if rid in self.first_input:
            return self.first_input[rid]
        handle = self.handles.get(rid)
        return None if handle is None else tuple(int(t) for t in handle.origin_input_ids)

    def output_of(self, rid: Any) -> tuple[int, ...]:
        handle = self.handles.get(rid)
        return () if handle is None else tuple(int(t) for t in handle.output_ids)

    def checks(self) -> list[Finding]:
        """The loop's own findings for the probe (``admission_watch``)."""
        return self.watch.findings()

    # -- the clients' operations ------------------------------------------------------------
    def submit(
        self,
        rid: str,
        prompt: list[int],
        max_new: int,
        session_id: str | None = None,
        priority: int | None = None,
    ) -> RequestHandle:
        """A request (or a session's next turn) sent to the scheduler."""
        handle = self.handles[rid] = RequestHandle(rid, list(prompt), max_new)
        self.inbox.messages.append(
            messages.generate(
                self.io,
                rid,
                prompt,
                max_new,
                session_id=session_id,
                priority=priority,
                arrays=self.array_ids,
            )
        )
        return handle

    def abort(self, rid: str) -> None:
        """An ``AbortReq`` for ``rid`` (SGLang matches it as a prefix)."""
        self.notify()  # what the request holds, just before
        self.asked_aborts.append(rid)
        for req in self.live_requests():
            if req.rid.startswith(rid):
                self.where_asked[req.rid] = "queue" if req in self.waiting_queue else "running"
        for message in self.inbox.messages:  # not received yet: it never ran
            if str(getattr(message, "rid", None)).startswith(rid):
                self.where_asked[message.rid] = "queue"
        self.inbox.messages.append(call_offered(self.io.AbortReq, rid=rid))

    def open_session(self, session_id: str) -> None:
        message = call_offered(
            self.io.OpenSessionReqInput,
            capacity_of_str_len=1 << 20,
            session_id=session_id,
            streaming=self.config.streaming,
        )
        self.inbox.messages.append(message)

    def close_session(self, session_id: str) -> None:
        self.inbox.messages.append(
            call_offered(self.io.CloseSessionReqInput, session_id=session_id)
        )

    def step(self) -> bool:
        """One iteration of the release's event loop; whether it ran a batch."""
        self.step_no += 1
        self.clock.advance()
        self.loop.step()
        ran = self.sched.last_batch is not None
        for req in self.running_requests():
            # a request SGLang set to finish before it ever ran (turned down, or aborted
            # while queued) runs a one-token stand-in over [0], not its prompt
            if req.rid not in self.ran and getattr(req, "to_finish", None) is None:
                self.ran.add(req.rid)
                self.first_input[req.rid] = tuple(int(t) for t in req.origin_input_ids)
        self._read_outputs()
        self.watch.observe(self, ran)
        self.notify()
        return ran

    def flush(self) -> bool:
        """Evict everything evictable through the release's own eviction; False while
        requests are live."""
        if not self.idle():
            return False
        _evict_all(self.tree_cache, self.release, self.capacity, self.config.pools.page_size)
        return True

    def run_until_idle(self, max_steps: int = 10_000) -> int:
        """Step until idle (at most ``max_steps``), the clients doing nothing meanwhile."""
        steps = 0
        while not self.idle() and steps < max_steps:
            self.step()
            steps += 1
        return steps

    def close(self) -> None:
        self.loop.stop()

    # -- what the scheduler made and sent ---------------------------------------------------
    def failure(self, ended: Outcome) -> dict:
        why = f": {ended.why}" if ended.why else ""
        return {
            "name": ended.rid,
            "status": 0,
            "error": f"SGLang aborted it at step {ended.step}{why}",
        }

    def _note_queued(self) -> None:
        """Note each ``Req`` where the scheduler queues it (the handle's request)."""
        queue = self.sched._add_request_to_queue

        def noted(req: Any, *args: Any, **kwargs: Any) -> Any:
            handle = self.handles.get(req.rid)
            if handle is not None:
                handle.req = req
            return queue(req, *args, **kwargs)

        self.sched._add_request_to_queue = noted

    def _read_outputs(self) -> None:
        for outbox in self.sched.kvwatch_outboxes:
            start = self.read_upto.get(id(outbox), 0)
            for message in outbox.sent[start:]:
                for rid, reason in messages.ends(message):
                    self._end(rid, reason)
            self.read_upto[id(outbox)] = len(outbox.sent)

    def _end(self, rid: str, reason: dict) -> None:
        if any(o.rid == rid for o in self.outcomes):
            return
        status, why = self._status(rid, reason), str(reason.get("message") or "")
        handle = self.handles.get(rid)
        if handle is not None and handle.req is None and status != FINISHED:
            handle.abort_reason = self.sb.FINISH_ABORT(why)
        why = why if status != FINISHED else ""
        self.outcomes.append(Outcome(rid=rid, status=status, step=self.step_no, why=why))

    def asked_to_abort(self, rid: str) -> bool:
        return any(rid.startswith(prefix) for prefix in self.asked_aborts)

    def _status(self, rid: str, reason: dict) -> str:
        if reason.get("type") != "abort":
            return FINISHED
        message = str(reason.get("message") or "").lower()
        if self.asked_to_abort(rid):
            return ABORTED_IN_QUEUE if self.where_asked.get(rid) == "queue" else ABORTED
        if any(w in message for w in TIMEOUT_WORDS):
            return TIMED_OUT
        if any(w in message for w in REJECT_WORDS):
            return REJECTED
        return ABORTED_BY_SGLANG


def _capacity(read: PoolReader) -> dict[str, int]:
    """Units per pool while every unit is free: what a flush asks the tree to evict."""
    sizes = {KV: len(set(read.kv_free()))}
    if read.swa:
        sizes[SWA] = len(set(read.swa_free()))
    if (mamba := read.mamba_free()) is not None:
        sizes[MAMBA] = len(set(mamba))
    return sizes


def _evict_all(cache: Any, release: Release, capacity: dict[str, int], page: int) -> None:
    """The whole pool's worth of tokens (and mamba slots) evicted through the release's
    own ``tree.evict``: its ``EvictParams`` where it has them (0.5.16+)."""
    tree, base = inner(cache), release.module("base")
    tokens = capacity[KV] * page
    if not hasattr(base, "EvictParams"):
        tree.evict(tokens)
        if MAMBA in capacity and hasattr(tree, "evict_mamba"):
            tree.evict_mamba(capacity[MAMBA])
        return
    fields = base.EvictParams.__dataclass_fields__
    wanted = {"num_tokens": tokens}
    if MAMBA in capacity and "mamba_num" in fields:
        wanted["mamba_num"] = capacity[MAMBA]
    if SWA in capacity and "swa_num_tokens" in fields:
        wanted["swa_num_tokens"] = capacity[SWA] * page
    tree.evict(base.EvictParams(**wanted))
