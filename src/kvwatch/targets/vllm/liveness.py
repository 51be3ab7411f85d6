"""White-box checks of a live vLLM scheduler: running requests are scheduled.

``LivenessTracker`` wraps each ``schedule()`` (``before`` and ``after``):
``running-skipped`` and ``running-starved``, as ``checks.py`` describes
them, with its known blind spots; a request Mamba's block-aligned prefill
holds back (``aligned_split``), or a prefill chunk the local prefill cadence
holds back (``prefill_held``), is not passed over. ``stalled`` is the in-process driver's:
``scheduler-stalled``, a run of steps that scheduled nothing, with nothing in
flight, while requests had work left and no session paused for its client's
input held blocks (no running request to preempt, and the waiting ones
cannot get blocks: nothing will ever move). ``reset_refused``
is too: ``reset-refused``, a forced prefix-cache reset that preempted the
running requests and still failed, the index left standing. Duck-typed:
nothing is imported from vLLM.
"""

from __future__ import annotations

from collections.abc import Callable

from kvwatch.targets.vllm.check_findings import violation
from kvwatch.targets.vllm.manager_audit import (
    RESET_REFUSED,
    RUNNING_SKIPPED,
    RUNNING_STARVED,
    SCHEDULER_STALLED,
    Violation,
)
from kvwatch.targets.vllm.scheduler_reads import group_managers, table


def holds_blocks(scheduler, request_id: str) -> bool:
    return any(
        not getattr(block, "is_null", False)
        for _, manager in group_managers(scheduler)
        for block in table(manager, request_id)
    )


def work_left(request) -> int:
    """Tokens the running loop could still schedule for ``request``, less a step in
    flight that could only produce past ``max_tokens`` (async scheduling's last one)."""
    placeholders = getattr(request, "num_output_placeholders", 0) or 0
    pending = request.num_tokens_with_spec + placeholders - request.num_computed_tokens
    limit = getattr(request, "max_tokens", None)
    last = request.num_computed_tokens + 2 - placeholders
    if placeholders and limit is not None and last >= request.num_prompt_tokens + limit:
        return 0
    return max(0, pending)


def prefill_held(scheduler) -> bool:
    """Whether the next ``schedule()`` holds running prefill chunks back for the local
    prefill cadence (``--prefill-schedule-interval N``): fewer than N executed steps
    since the last one that carried prefill, decodes running, and the waiting queue
    not backed up past what a release step drains (``prefill_capacity_bound``), read
    as the scheduler reads it before it schedules."""
    interval = getattr(scheduler, "local_prefill_interval", 1)
    if interval <= 1 or getattr(scheduler, "prefill_capacity_bound", False):
        return False
    since = (getattr(scheduler, "num_executed_steps", 0) + 1) - getattr(
        scheduler, "last_prefill_step", 0
    )
    decoding = any(not getattr(r, "is_prefill_chunk", False) for r in scheduler.running)
    return since < interval and decoding


def aligned_split(scheduler, out, order: list[str]) -> Callable | None:
    """Mamba's block-aligned prefill (``mamba_cache_mode="align"``): a chunk must end
    on a block boundary unless it ends the prompt, so the scheduler holds back a
    running request whose budget, when its walk reached it, cannot reach the next
    boundary. None where the scheduler does not split so. The budget then is the
    step's less what the running requests before it in ``order`` took::

        block:   |------- 64 -------|------- 64 -------|
        request:  computed ..start^       ^start+spare: no boundary between, held back
    """
    if not getattr(scheduler, "need_mamba_block_aligned_split", False):
        return None
    budget = getattr(scheduler, "max_num_scheduled_tokens", 0)
    block = scheduler.cache_config.block_size
    took = out.num_scheduled_tokens
    rank = {rid: i for i, rid in enumerate(order)}

    def held(request) -> bool:
        spare = budget - sum(took.get(r, 0) for r in order[: rank.get(request.request_id, 0)])
        start = request.num_computed_tokens
        prefill_end = max(request.num_prompt_tokens, request.num_tokens - 1)
        if start >= prefill_end or start + spare >= prefill_end:
            return False
        return (start + spare) // block * block <= start

    return held


def _preempted(scheduler, out, order: list[str]) -> set[str]:
    """Who this step preempted: the output says so, or the request's status does."""
    named = set(getattr(out, "preempted_req_ids", None) or ())
    for request_id in order:
        request = scheduler.requests.get(request_id)
        status = getattr(getattr(request, "status", None), "name", "")
        if "PREEMPT" in str(status):
            named.add(request_id)
    return named


class LivenessTracker:
    """``before(scheduler)`` right before ``schedule()``, ``after(scheduler, output,
    deferred)`` right after it. ``deferred(request) -> bool`` names requests the
    engine itself asked the scheduler to hold back this step (data-parallel
    prefill throttling holds back prefill chunks)."""

    def __init__(self, bound: int = 2) -> None:
        self.bound = bound
        self.missed: dict[str, int] = {}
        self.order: list[str] = []
        self.pending: dict[str, int] = {}
        self.holding: set[str] = set()
        self.cadence = False  # this step holds running prefill chunks (``prefill_held``)

    def before(self, scheduler) -> None:
        self.cadence = prefill_held(scheduler)
        self.order = [r.request_id for r in scheduler.running]
        self.pending = {r.request_id: work_left(r) for r in scheduler.running}
        self.holding = {rid for rid in self.order if holds_blocks(scheduler, rid)}

    def after(self, scheduler, out, deferred: Callable | None = None) -> list[Violation]:
        scheduled = set(out.num_scheduled_tokens)
        preempted = _preempted(scheduler, out, self.order)
        running = {r.request_id for r in scheduler.running}
        used = getattr(out, "total_num_scheduled_tokens", sum(out.num_scheduled_tokens.values()))
        budget = getattr(scheduler, "max_num_scheduled_tokens", None)
        spare = None if budget is None else budget - used
        found: list[Violation] = []
        aligned = aligned_split(scheduler, out, self.order)
        for rid in self.order:
            passed_over = rid in running and rid not in scheduled and rid not in preempted
            request = scheduler.requests[rid]
            held = (aligned is not None and aligned(request)) or (
                self.cadence and getattr(request, "is_prefill_chunk", False)
            )
            if passed_over and not held and self._could_run(scheduler, rid, deferred) and spare:
                found += self._missed(rid, scheduled, preempted, spare)
            else:
                self.missed.pop(rid, None)
        self.missed = {rid: n for rid, n in self.missed.items() if rid in scheduler.requests}
        return found

    def _could_run(self, scheduler, rid: str, deferred: Callable | None) -> bool:
        held_back = deferred is not None and deferred(scheduler.requests[rid])
        return self.pending.get(rid, 0) > 0 and rid in self.holding and not held_back

    def _missed(self, rid: str, scheduled: set, preempted: set, spare: int) -> list[Violation]:
        """``rid`` was passed over. The walk visits running requests in order and stops
        early only when the budget is spent or a request that could not get blocks
        preempted itself: a preempted request after every scheduled one, before ``rid``."""
        self.missed[rid] = self.missed.get(rid, 0) + 1
        pos = {r: i for i, r in enumerate(self.order)}
        last = max((pos[r] for r in scheduled if r in pos), default=-1)
        out = []
        if not any(last < pos.get(p, -1) < pos[rid] for p in preempted):
            later = [r for r in self.order[pos[rid] + 1 :] if r in scheduled]
            detail = (
                f"request {rid} (running, {self.pending[rid]} tokens to compute, holds blocks) "
                f"was not scheduled although {spare} tokens of budget were left and "
                f"{len(later)} request(s) after it were ({', '.join(later[:3])}); "
                f"preempted this step: {', '.join(sorted(preempted)) or 'none'}"
            )
            out.append(violation(RUNNING_SKIPPED, detail, requests=(rid,)))
        if self.missed[rid] > self.bound:
            detail = (
                f"request {rid} holds blocks and has work left but was neither scheduled nor "
                f"preempted for {self.missed[rid]} steps in a row with budget to spare"
            )
            out.append(violation(RUNNING_STARVED, detail, requests=(rid,)))
        return out


def stalled(scheduler, steps: int, work: list[str]) -> Violation:
    """``scheduler-stalled``: ``steps`` steps in a row scheduled nothing with nothing in
    flight while the requests ``work`` had work left."""
    pool = scheduler.kv_cache_manager.block_pool
    free, total = pool.get_num_free_blocks(), len(pool.blocks) - 1
    holding = [rid for rid in work if holds_blocks(scheduler, rid)]
    detail = (
        f"{steps} steps in a row scheduled nothing with nothing in flight while {len(work)} "
        f"requests had work left ({len(scheduler.running)} running; {free} of {total} blocks "
        f"free; {len(holding)} waiting requests hold blocks: {', '.join(holding[:4]) or 'none'}): "
        f"no request can make progress"
    )
    return violation(SCHEDULER_STALLED, detail, requests=tuple(work[:20]))


def reset_refused(scheduler, why: str) -> Violation:
    """``reset-refused``: ``reset_prefix_cache(reset_running_requests=True)`` (what a
    weight update's pause with ``clear_cache`` calls) preempted every running request
    and still left the prefix index standing, because of ``why``; who holds blocks."""
    holders = sorted(rid for rid in scheduler.requests if holds_blocks(scheduler, rid))
    statuses = {scheduler.requests[rid].status.name for rid in holders}
    pool = scheduler.kv_cache_manager.block_pool
    held = len(pool.blocks) - 1 - pool.get_num_free_blocks()
    detail = (
        f"reset_prefix_cache(reset_running_requests=True) failed ({why[:120]}): {held} blocks "
        f"stay held by {len(holders)} requests that are not running "
        f"({', '.join(sorted(statuses)) or 'none'}: {', '.join(holders[:4])}); the running ones "
        f"were preempted anyway and every cached prefix stays reachable"
    )
    return violation(RESET_REFUSED, detail, requests=tuple(holders[:20]))
