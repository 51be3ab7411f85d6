"""What the scheduler driver shares with the probe, the workloads and the recorder: the
run's settings, what became of each request, and the loop's bookkeeping.

``own_scheduler.OwnScheduler`` steps a release's own ``Scheduler`` and
presents it through this surface (the name ``ShimLoop`` is the surface's, from
when a shim stood in for releases the scheduler was not built for). This
module holds:

* ``PoolConfig``, ``ShimConfig``: the pools and scheduler settings of one run;
* ``Outcome``: what became of a request, as its client would hear it;
* ``call_offered``: a call with the keyword arguments the release's callee takes;
* ``ShimLoop``: what is live, stepping until idle, the observers called after
  every step (the probe's per-step audit), and the liveness hooks
  (``stalled``, ``checks``) of the admission watch.

Invariant: the driver hands requests and sessions to SGLang when the workload
calls ``submit`` / ``abort`` / ``open_session`` / ``close_session``, at the
scheduler's next ``recv_requests``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

FINISHED = "finished"
ABORTED = "aborted"  # the client aborted it while it ran
ABORTED_IN_QUEUE = "aborted-in-queue"  # the client aborted it while it waited
TIMED_OUT = "timed-out"  # the waiting timeout dropped it
# SGLang turned it away by design: the queue was full, or a higher-priority request
# took its place in it (--max-queued-requests, priority scheduling)
REJECTED = "rejected"
ABORTED_BY_SGLANG = "aborted-by-sglang"  # SGLang ended it without being asked
ON_PURPOSE = (ABORTED, ABORTED_IN_QUEUE, TIMED_OUT, REJECTED)  # what the load provokes


class PoolConfig(NamedTuple):
    kv_tokens: int  # token slots in the KV pool (a multiple of page_size)
    page_size: int = 1
    req_slots: int = 64  # rows of the request-to-token table
    max_context_len: int = 4096
    mamba_slots: int | None = None  # None: no state pool
    swa_tokens: int | None = None  # None: no sliding-window sub-pool
    sliding_window: int | None = None


@dataclass(frozen=True, kw_only=True)
class ShimConfig:
    pools: PoolConfig
    streaming: bool = False  # the release's streaming-session cache around the tree
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int = 16384
    max_running_requests: int = 32  # plays pp_max_micro_batch_size
    waiting_timeout_steps: int | None = None  # SGLANG_REQ_WAITING_TIMEOUT, in steps
    retract_every: int | None = None  # a forced retraction every N decode steps
    # --enable-priority-scheduling, --max-queued-requests, the overlap event loop
    priority_scheduling: bool = False
    max_queued_requests: int | None = None
    overlap: bool = False
    init_new_token_ratio: float = 0.7
    min_new_token_ratio: float = 0.1
    new_token_ratio_decay: float = 0.001


class Outcome(NamedTuple):
    rid: str
    status: str  # FINISHED, ABORTED, ABORTED_IN_QUEUE, TIMED_OUT, REJECTED, ABORTED_BY_SGLANG
    step: int
    why: str = ""  # SGLang's message for an abort it sent (the own scheduler)


def call_offered(fn: Callable, *args: Any, **offered: Any) -> Any:
    """``fn(*args, **kwargs)`` with the offered keyword arguments it takes."""
    params = inspect.signature(fn.__init__ if isinstance(fn, type) else fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return fn(*args, **offered)
    return fn(*args, **{k: v for k, v in offered.items() if k in params})


class ShimLoop:
    """The bookkeeping of a scheduler loop; the driver adds ``step``, ``submit``, ``abort``."""

    def __init__(self, config: ShimConfig, seed: int) -> None:
        self.config = config
        self.seed = seed
        self.step_no = 0
        self.outcomes: list[Outcome] = []
        self.asked_aborts: list[str] = []  # rid prefixes the client asked to abort
        self.observers: list[Callable[[], None]] = []  # after every step and abort
        from kvwatch.targets.sglang.admission_watch import AdmissionWatch

        self.watch = AdmissionWatch()  # does the scheduler still admit?

    def ended(self, rid: str, status: str, why: str = "") -> None:
        self.outcomes.append(Outcome(rid=rid, status=status, step=self.step_no, why=why))

    def asked_to_abort(self, rid: str) -> bool:
        return any(rid.startswith(prefix) for prefix in self.asked_aborts)

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

    def idle(self) -> bool:
        return not self.live_requests()

    def notify(self) -> None:
        for observe in self.observers:
            observe()

    def step(self) -> bool:
        raise NotImplementedError

    def after_step(self, ran: bool) -> None:
        """The end of every step: the liveness watch, then the observers."""
        self.watch.observe(self, ran)
        self.notify()

    def stalled(self) -> bool:
        """Whether the scheduler stopped admitting with requests waiting."""
        return self.watch.stalled

    def checks(self) -> list[Any]:
        """The driver's own findings for the probe (``admission_watch``)."""
        return self.watch.findings()

    def close(self) -> None:
        """The run is over (a driver with a thread ends it)."""

    def run_until_idle(self, max_steps: int = 10_000) -> int:
        steps = 0
        while not self.idle() and steps < max_steps:
            self.step()
            steps += 1
        return steps
