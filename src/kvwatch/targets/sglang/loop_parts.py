"""What SGLang's scheduler loop shares with its workloads, probe and setup: a run's settings,
the statuses a request ends in, and calls fitted to a release's signatures.

* ``PoolConfig``, ``LoopConfig``: the pools and scheduler settings of one run;
* the statuses of ``Outcome`` (``kvwatch.targets.driver.engine_loop``) a client
  of SGLang hears: finished, aborted while running or while queued, timed out,
  rejected by design, aborted by SGLang unasked;
* ``call_offered``: a call with the keyword arguments the release's callee takes.

Invariant: nothing here touches SGLang; ``loop.SchedulerLoop`` does.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from kvwatch.targets.driver.engine_loop import ABORTED as ABORTED
from kvwatch.targets.driver.engine_loop import FINISHED as FINISHED

# FINISHED: it ran to its end; ABORTED: its client aborted it while it ran
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
class LoopConfig:
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


def call_offered(fn: Callable, *args: Any, **offered: Any) -> Any:
    """``fn(*args, **kwargs)`` with the offered keyword arguments it takes."""
    params = inspect.signature(fn.__init__ if isinstance(fn, type) else fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return fn(*args, **offered)
    return fn(*args, **{k: v for k, v in offered.items() if k in params})
