"""What one ``--engine vllm-scheduler`` run exercised: counts the hunt's coverage table shows.

``Coverage.step(scheduler, output)`` after each ``schedule()`` counts steps,
preemptions, prefix hits at a request's first admission (and those that land inside a block,
which only fine hashing allows), copy-on-write block copies, and the most
partial-block entries the pools held at once (keys on blocks whose hash
covers fewer tokens than the block's end, and keys filed beside a block's
own). Read-only and duck-typed, as the checks: nothing is imported from
vLLM. Invariant: counts only grow; ``as_dict`` adds the event totals.
"""

from __future__ import annotations

from collections import Counter

from kvwatch.targets.vllm.scheduler_reads import group_managers


def partial_entries(scheduler) -> int:
    """Prefix keys that name a boundary inside a block, over every group."""
    count, seen = 0, set()
    for _, manager in group_managers(scheduler):
        pool, size = manager.block_pool, manager.block_size
        if id(pool) not in seen:
            seen.add(id(pool))
            extra = getattr(pool, "cached_block_hashes_by_block", None) or {}
            count += sum(len(keys) for keys in extra.values())
        group = getattr(manager, "kv_cache_group_id", None)
        for block in pool.blocks:
            n, key = getattr(block, "block_hash_num_tokens", None), block.block_hash
            mine = isinstance(key, bytes) and int.from_bytes(key[-4:], "big") == group
            count += bool(mine and isinstance(n, int) and n % size)
    return count


class Coverage:
    """Counts over a run's steps (see the module docstring)."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.admitted: set[str] = set()  # a session's later chunks start where it stood

    def step(self, scheduler, out) -> None:
        c = self.counts
        c["steps"] += 1
        c["preemptions"] += len(getattr(out, "preempted_req_ids", None) or ())
        c["block copies"] += len(getattr(out, "kv_cache_block_copies", None) or ())
        size = scheduler.block_size
        for new in getattr(out, "scheduled_new_reqs", ()):
            if new.req_id in self.admitted:
                continue
            self.admitted.add(new.req_id)
            hit = getattr(new, "num_computed_tokens", 0)
            c["prefix hits"] += hit > 0
            c["mid-block hits"] += bool(hit % size)
        c["partial entries (most)"] = max(c["partial entries (most)"], partial_entries(scheduler))

    def as_dict(self, events: dict | None = None) -> dict:
        return {**dict(self.counts), **({"events": events} if events is not None else {})}
