"""Liveness of a scheduler driver: requests wait while nothing runs.

After every step, ``AdmissionWatch.observe`` counts the iterations in a row
in which the scheduler ran no batch, had no chunked prefill in progress and
no request running, while requests waited (SGLang's virtual clock moves one
second per iteration). Two bounds:

* ``stalled``: ``STALL_STEPS`` such iterations: nothing the scheduler runs
  will free memory or finish a request, so the workload's clients give up
  (they abort what they sent, as a client would after a timeout), whatever
  the reason; a queue whose first request cannot fit even an idle engine
  (its memory pinned by streaming sessions, say) is one such reason, and
  no finding of its own;
* a ``starved`` finding (``findings``): ``STALL_STEPS`` such iterations in
  which the first waiting request, a plain one (no session), fits what an
  idle engine offers: its prompt, its output reserve (``max_new_tokens``
  clipped as SGLang clips it) and a page within the KV pool's free and
  evictable tokens, a free request row and, with a mamba cache, a free
  mamba slot. The scheduler has stopped admitting what it could run. The
  finding names the waiting requests and what the scheduler holds: its
  running batch's ``batch_is_full`` flag and the KV pool's free and
  evictable tokens.

Invariant: reading only; both counts restart whenever a batch runs or the
queue empties.
"""

from __future__ import annotations

from typing import Any

from kvwatch.contracts import Finding, FindingKind, finding

KV = "sglang.kv"  # pool_holders.KV
STALL_STEPS = 64
SHOWN = 4  # waiting requests named
CLIP_MAX_NEW_TOKENS = 4096  # SGLang's schedule_policy default for the output reserve


class AdmissionWatch:
    def __init__(self, bound: int = STALL_STEPS) -> None:
        self.bound = bound
        self.idle_steps = 0  # consecutive iterations with waiting requests and no batch
        self.fitting_steps = 0  # of those, with a first request an idle engine fits
        self.detail = ""

    def observe(self, driver: Any, ran_batch: bool) -> None:
        """After a step of ``driver`` (the release's own scheduler, ``loop.SchedulerLoop``) that ran a batch
        or not."""
        waiting = list(driver.waiting_queue)
        running = driver.running_batch
        busy = ran_batch or driver.chunked_req is not None or not running.is_empty()
        if busy or not waiting:
            self.idle_steps, self.fitting_steps, self.detail = 0, 0, ""
            return
        self.idle_steps += 1
        free, evictable = _kv_room(driver)
        fits = _fits(driver, waiting[0], free + evictable)
        self.fitting_steps = self.fitting_steps + 1 if fits else 0
        if self.fitting_steps >= self.bound:
            self.detail = self._describe(driver, waiting, free, evictable)

    @property
    def stalled(self) -> bool:
        return self.idle_steps >= self.bound

    def _describe(self, driver: Any, waiting: list, free: int, evictable: int) -> str:
        first = waiting[0]
        others = ", ".join(r.rid for r in waiting[1:SHOWN])
        more = f" (+{len(waiting) - SHOWN} more)" if len(waiting) > SHOWN else ""
        flag = getattr(driver.running_batch, "batch_is_full", None)
        return (
            f"admission stalled: no batch ran for {self.fitting_steps} scheduler iterations "
            f"while {len(waiting)} requests waited; an idle engine fits the first, request "
            f"{first.rid} ({len(first.origin_input_ids)} prompt, "
            f"{first.sampling_params.max_new_tokens} new tokens)"
            + (f"; also waiting: {others}{more}" if others else "")
            + f"; the running batch is empty (batch_is_full={flag}), the KV pool has {free} "
            f"free and {evictable} evictable of {driver.pools.allocator.size} tokens"
        )

    def findings(self) -> list[Finding]:
        if self.fitting_steps < self.bound:
            return []
        return [finding(FindingKind.STARVED, KV, [], self.detail, key="admission-stalled")]


def _kv_room(driver: Any) -> tuple[int, int]:
    """The KV pool's free tokens and the tree's evictable ones."""
    cache = driver.tree_cache
    tree = cache.__dict__.get("inner", cache)
    full = getattr(tree, "full_evictable_size", None)  # a mamba or SWA tree
    evictable = full() if full is not None else tree.evictable_size()
    evictable = evictable[0] if isinstance(evictable, tuple) else evictable
    return int(driver.pools.allocator.available_size()), int(evictable)


def _fits(driver: Any, req: Any, room: int) -> bool:
    """Whether an idle engine fits ``req``, a plain request (session turns: unknown)."""
    if getattr(req, "session", None) is not None or getattr(req, "session_id", None):
        return False
    pools = driver.pools
    reserve = min(req.sampling_params.max_new_tokens, CLIP_MAX_NEW_TOKENS)
    need = len(req.origin_input_ids) + len(req.output_ids) + reserve + pools.config.page_size
    rows = len(pools.req_to_token_pool.free_slots) > 0
    slots = pools.mamba_slots
    mamba = slots is None or len(slots.free_slots) > 0
    return need < room and rows and mamba
