"""What the scheduler drivers share: the run's settings, the messages they pass to
SGLang's code, what became of each request, and the loop's bookkeeping.

Two drivers step a release's scheduling: ``own_scheduler.OwnScheduler``
runs the release's own ``Scheduler`` (0.5.4.post3 .. 0.5.13.post1), and
``checkpoint_shim.CheckpointScheduler`` plays its event loop over SGLang's
own ``Req``, ``Session``, ``ScheduleBatch``, ``PrefillAdder``, caches and
pools where the scheduler cannot be built on a CPU host (0.5.22+). Both
present the same surface to the probe, the workloads and the recorder. This
module holds:

* ``PoolConfig``, ``SpecConfig``, ``ShimConfig``: the pools, speculative
  decoding and scheduler settings of one run;
* ``Params`` / ``Incoming`` / ``ModelConfig``: the sampling parameters,
  incoming request messages and model facts the shim hands SGLang's code
  (the fields given, ``None`` for the rest);
* ``Outcome``: what became of a request, as its client would hear it;
* ``ShimLoop``: the queue, the batches, what is live, stepping until idle,
  the observers called after every step (the probe's per-step audit), and
  the liveness hooks (``stalled``, ``checks``) a driver may answer.

Invariant: a driver hands requests and sessions to SGLang when the workload
calls ``submit`` / ``abort`` / ``open_session`` / ``close_session`` (the
shim at once, the own scheduler at its next ``recv_requests``).
"""

from __future__ import annotations

import inspect
import random
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


class SpecConfig(NamedTuple):
    num_steps: int = 3  # draft tokens proposed per step
    topk: int = 1

    @property
    def num_draft_tokens(self) -> int:
        return self.num_steps + 1


@dataclass(frozen=True, kw_only=True)
class ShimConfig:
    pools: PoolConfig
    streaming: bool = False  # the release's streaming-session cache around the tree
    spec: SpecConfig | None = None  # EAGLE spec-v2 over-allocation
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int = 16384
    max_running_requests: int = 32  # plays pp_max_micro_batch_size
    waiting_timeout_steps: int | None = None  # SGLANG_REQ_WAITING_TIMEOUT, in steps
    retract_every: int | None = None  # a forced retraction every N decode steps
    # the own scheduler only (refused by the shims): --enable-priority-scheduling,
    # --max-queued-requests, the overlap event loop
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


class Params:
    """``SamplingParams``: length-limited generation, no stop tokens or strings."""

    def __init__(self, max_new_tokens: int) -> None:
        self.max_new_tokens = max_new_tokens
        self.ignore_eos = False  # no EOS in random tokens; admission uses the new-token ratio
        self.stop_token_ids: set[int] = set()
        self.stop_strs: list[str] = []
        self.stop_regex_strs: list[str] = []
        self.custom_params = None
        self.n = 1

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return None


class Incoming:
    """An incoming message (``TokenizedGenerateReqInput``, ``OpenSessionReqInput``,
    ``CloseSessionReqInput``): the fields given, ``None`` for the rest."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return None


class ModelConfig:
    """The model facts ``ScheduleBatch`` reads: a plain decoder-only text model."""

    vocab_size = 32000
    hidden_size = 64
    is_encoder_decoder = False
    is_matryoshka = False
    is_multimodal = False


def call_offered(fn: Callable, *args: Any, **offered: Any) -> Any:
    """``fn(*args, **kwargs)`` with the offered keyword arguments it takes."""
    params = inspect.signature(fn.__init__ if isinstance(fn, type) else fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return fn(*args, **offered)
    return fn(*args, **{k: v for k, v in offered.items() if k in params})


class ShimLoop:
    """The bookkeeping of a scheduler loop; a shim adds ``step``, ``submit``, ``abort``."""

    def __init__(self, config: ShimConfig, seed: int) -> None:
        self.config = config
        self.rng = random.Random(seed)
        self.step_no = 0
        self.outcomes: list[Outcome] = []
        self.asked_aborts: list[str] = []  # rid prefixes the client asked to abort
        self.observers: list[Callable[[], None]] = []  # after every step and abort
        from kvwatch.targets.sglang.admission_watch import AdmissionWatch

        self.watch = AdmissionWatch()  # does the scheduler still admit?
        self._loop_state()

    def _loop_state(self) -> None:
        """The loop's own queue and batches (a driver over SGLang's scheduler reads
        SGLang's instead)."""
        self.waiting_queue: list[Any] = []
        self.queued_at: dict[int, int] = {}  # id(req) -> the step it was queued at
        self.last_batch: Any = None
        self.last_kind: str | None = None  # "extend" or "decode"
        self.chunked_req: Any = None
        self.new_token_ratio = self.config.init_new_token_ratio
        self.decode_steps = 0
        self.retractions = 0  # requests retracted, all told
        self.sessions: Any = None  # SGLang's SessionController (0.5.10+)
        self.running_batch: Any = None

    def queue(self, req: Any) -> None:
        """``_add_request_to_queue``."""
        self.waiting_queue.append(req)
        self.queued_at[id(req)] = self.step_no

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

    def late(self) -> list[Any]:
        """Queued requests older than the waiting timeout (steps)."""
        limit = self.config.waiting_timeout_steps
        if limit is None:
            return []
        since = self.queued_at
        return [
            r for r in self.waiting_queue if self.step_no - since.get(id(r), self.step_no) > limit
        ]

    def token(self) -> int:
        """The model: a random token (never a special one)."""
        return self.rng.randrange(3, ModelConfig.vocab_size)

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
