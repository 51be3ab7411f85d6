"""The release's own ``Scheduler`` as a driver: what the probe, the workloads and the
recorder see of it (the surface of ``shim_parts.ShimLoop``).

``OwnScheduler(release, config)`` builds the release's ``Scheduler``
(``scheduler_setup.build``) and steps its own event loop
(``paced_loop.PacedLoop``): one ``step()`` is one iteration of the loop as
SGLang ships it, the virtual clock one second on. The clients' side is
messages, as the tokenizer manager sends them: ``submit`` queues a
``TokenizedGenerateReqInput`` (token ids, ``SamplingParams``, a session's
``SessionParams``, a priority), ``abort`` an ``AbortReq``, ``open_session`` /
``close_session`` their requests; the scheduler takes them at its next
``recv_requests``. What the scheduler sends back (its outputs to the
tokenizer and detokenizer) becomes ``outcomes``: finished, aborted by the
client (in the queue or running), timed out, rejected by design (queue full,
a higher priority), or aborted by SGLang unasked.

``submit`` returns a ``RequestHandle``: SGLang's own ``Req`` once the
scheduler made it (noted where it queues it, ``_add_request_to_queue``), the
message's tokens until then. The queue, batches, tree cache and session
controller the probe reads are the scheduler's own attributes; the pools
are the worker's, the release's classes. ``ShimLoop``'s admission watch
reports a scheduler that stops admitting (``stalled``, ``checks``).

Invariant: the driver changes SGLang's state only through the messages a
tokenizer manager would send; everything else here reads.
"""

from __future__ import annotations

import importlib
import inspect
from array import array
from types import SimpleNamespace
from typing import Any

from kvwatch.targets.sglang import scheduler_host, scheduler_imports, scheduler_setup
from kvwatch.targets.sglang.loop_parts import (
    ABORTED,
    ABORTED_BY_SGLANG,
    ABORTED_IN_QUEUE,
    FINISHED,
    REJECTED,
    TIMED_OUT,
    ShimConfig,
    ShimLoop,
    call_offered,
)
from kvwatch.targets.sglang.paced_loop import PacedLoop
from kvwatch.targets.sglang.release_import import Release
from kvwatch.targets.sglang.stand_in_worker import TokenModel

TIMEOUT_WORDS = ("waiting timeout",)  # _abort_on_waiting_timeout's message
REJECT_WORDS = ("queue is full", "higher priority")  # _abort_on_queued_limit's messages


def environment(config: ShimConfig) -> dict[str, str]:
    """The environment SGLang reads for ``config`` while the run lasts."""
    return {"SGLANG_REQ_WAITING_TIMEOUT": str(config.waiting_timeout_steps or 0)}


class RequestHandle:
    """A submitted request: its ``Req`` once the scheduler made one."""

    def __init__(self, rid: str, input_ids: list[int], max_new_tokens: int) -> None:
        self.rid, self.sent_ids, self.max_new_tokens = rid, input_ids, max_new_tokens
        self.req: Any = None
        self.abort_reason: Any = None  # a FINISH_ABORT when it never became a Req

    def __getattr__(self, name: str) -> Any:
        req = self.__dict__.get("req")
        if req is not None:
            return getattr(req, name)
        unseen = {
            "origin_input_ids": self.sent_ids,
            "output_ids": [],
            "finished_len": 0,
            "finished_reason": self.abort_reason,
            "sampling_params": SimpleNamespace(max_new_tokens=self.max_new_tokens),
        }
        if name in unseen:
            return unseen[name]
        raise AttributeError(f"request {self.rid} never reached the scheduler: no {name!r}")


class OwnScheduler(ShimLoop):
    def __init__(
        self, release: Release, config: ShimConfig, seed: int = 0, model: TokenModel | None = None
    ) -> None:
        super().__init__(config, seed)
        self.release = release
        self.sb = release.module("schedule_batch")
        self.io = importlib.import_module("sglang.srt.managers.io_struct")
        self.model = model or TokenModel(seed)
        self.clock = scheduler_host.Clock()
        scheduler_imports.OWN_REPORTS.clear()
        self.sched, self.worker = scheduler_setup.build(release, config, self.clock, self.model)
        self.pools = self.worker.pools
        self.handles: dict[str, RequestHandle] = {}
        self.where_asked: dict[str, str] = {}  # rid -> "queue" or "running" at its abort
        self.read_upto: dict[int, int] = {}  # id(outbox) -> messages read
        self.array_ids = _tokenizer_sends_arrays(release)
        self._note_queued()
        self.loop = PacedLoop(self.sched, overlap=config.overlap)

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

    # -- clients ----------------------------------------------------------------------------
    def submit(
        self,
        rid: str,
        input_ids: list[int],
        max_new_tokens: int,
        session_id: str | None = None,
        priority: int | None = None,
    ) -> RequestHandle:
        """A request (or a session's next turn) sent to the scheduler."""
        handle = self.handles[rid] = RequestHandle(rid, list(input_ids), max_new_tokens)
        self.inbox.messages.append(
            self._generate(rid, input_ids, max_new_tokens, session_id, priority)
        )
        return handle

    def _generate(self, rid, input_ids, max_new_tokens, session_id, priority) -> Any:
        module = importlib.import_module("sglang.srt.sampling.sampling_params")
        params = module.SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
        params.normalize(None)
        if "vocab_size" in inspect.signature(params.verify).parameters:
            params.verify(scheduler_host.VOCAB)
        else:
            params.verify()
        session = None
        if session_id is not None:
            session = call_offered(self.io.SessionParams, id=session_id)
        ids = array("q", input_ids) if self.array_ids else list(input_ids)
        return call_offered(
            self.io.TokenizedGenerateReqInput,
            rid=rid,
            input_text="",
            input_ids=ids,
            mm_inputs=None,
            input_embeds=None,  # required fields of 0.5.22+'s message
            token_type_ids=None,
            sampling_params=params,
            return_logprob=False,
            logprob_start_len=-1,
            top_logprobs_num=0,
            token_ids_logprob=None,
            stream=False,
            priority=priority,
            session_params=session,
        )

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

    # -- the loop ---------------------------------------------------------------------------
    def step(self) -> bool:
        """One iteration of the release's event loop; whether it ran a batch."""
        self.step_no += 1
        self.clock.advance()
        self.loop.step()
        ran = self.sched.last_batch is not None
        self._read_outputs()
        self.after_step(ran)
        return ran

    def idle(self) -> bool:
        return not self.inbox.messages and not self.live_requests()

    def close(self) -> None:
        self.loop.stop()

    # -- what the scheduler made and sent ---------------------------------------------------
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
                for rid, reason in _ends(message):
                    self._end(rid, reason)
            self.read_upto[id(outbox)] = len(outbox.sent)

    def _end(self, rid: str, reason: dict) -> None:
        if any(o.rid == rid for o in self.outcomes):
            return
        status, why = self._status(rid, reason), str(reason.get("message") or "")
        handle = self.handles.get(rid)
        if handle is not None and handle.req is None and status != FINISHED:
            handle.abort_reason = self.sb.FINISH_ABORT(why)
        self.ended(rid, status, why if status != FINISHED else "")

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


def _ends(message: Any) -> list[tuple[str, dict]]:
    """The requests a message from the scheduler ends, with their finish reasons."""
    if type(message).__name__ == "AbortReq":
        return [(message.rid, dict(message.finished_reason or {"type": "abort"}))]
    rids = getattr(message, "rids", None) or []
    reasons = getattr(message, "finished_reasons", None) or [None] * len(rids)
    out = []
    for rid, reason in zip(rids, reasons, strict=False):
        if reason:
            out.append((rid, reason if isinstance(reason, dict) else reason.to_json()))
    return out


def _tokenizer_sends_arrays(release: Release) -> bool:
    """Whether the release's tokenizer manager sends token ids as ``array("q")``."""
    manager = release.root / "sglang/srt/managers/tokenizer_manager.py"
    return manager.is_file() and 'array("q", input_ids)' in manager.read_text()
