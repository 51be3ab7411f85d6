"""White-box checks of a live vLLM scheduler: its per-step scratch containers.

Every list, set, deque and dict the ``KVCacheManager``, its coordinator and
each group's manager keep, by attribute path (``checks.py`` says what
each finding means): ``scratch-not-drained``, ``scratch-over-pool`` and
``dead-request-key``. ``registries`` gives their sizes, which the gate
compares before and after a run (the quiescence detector). Duck-typed, as
the rest of these checks: nothing is imported from vLLM.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from kvwatch.targets.vllm.check_findings import NAMED, violation
from kvwatch.targets.vllm.manager_audit import (
    DEAD_REQUEST_KEY,
    SCRATCH_NOT_DRAINED,
    SCRATCH_OVER_POOL,
    Violation,
)
from kvwatch.targets.vllm.scheduler_reads import group_managers

AUDITED = frozenset({"req_to_blocks"})  # per-request tables manager_audit already judges


def owners(scheduler) -> list[tuple[str, object]]:
    """The objects whose containers are checked, by the path that names them."""
    kv = scheduler.kv_cache_manager
    out = [("kv_cache_manager", kv), ("kv_cache_manager.coordinator", kv.coordinator)]
    managers = kv.coordinator.single_type_managers
    out += [(f"kv_cache_manager.coordinator.managers[{i}]", m) for i, m in enumerate(managers)]
    return out


def containers(obj) -> Iterator[tuple[str, object]]:
    """(attribute, value) of each list, set, deque and dict ``obj`` keeps."""
    for name, value in vars(obj).items():
        if isinstance(value, list | set | frozenset | dict) or type(value).__name__ == "deque":
            yield name, value


def registries(scheduler) -> dict[str, int]:
    """The length of every container ``owners`` keep, by attribute path."""
    return {
        f"{path}.{name}": len(value)
        for path, obj in owners(scheduler)
        for name, value in containers(obj)
    }


def _is_block(item) -> bool:
    return (isinstance(item, int) and not isinstance(item, bool)) or hasattr(item, "block_id")


def _block_entries(items: list) -> tuple[int, ...] | None:
    """The block ids of a container of block ids, blocks, or tuples of blocks (pending
    copy pairs); None for any other container (config tuples, specs, group ids)."""
    pairs = all(
        isinstance(x, tuple) and x and all(hasattr(y, "block_id") for y in x) for x in items
    )
    if not (pairs or all(_is_block(x) for x in items)):
        return None
    flat = [y for x in items for y in (x if isinstance(x, tuple) else (x,))]
    return tuple(x if isinstance(x, int) else x.block_id for x in flat)


def check_scratch(scheduler, live: Iterable[str] | None = None) -> list[Violation]:
    """``scratch-not-drained``, ``scratch-over-pool`` and ``dead-request-key`` over the
    containers ``owners`` keep; ``live`` defaults to the scheduler's requests."""
    live = set(scheduler.requests if live is None else live)
    holding = {rid for _, m in group_managers(scheduler) for rid in m.req_to_blocks}
    size = len(scheduler.kv_cache_manager.block_pool.blocks)
    found: list[Violation] = []
    for path, obj in owners(scheduler):
        pool = getattr(obj, "block_pool", None)
        bound = len(pool.blocks) if pool is not None else size
        for name, value in containers(obj):
            where = f"{path}.{name}"
            if isinstance(value, dict):
                found += [] if name in AUDITED else _dead_keys(where, value, live | holding)
            elif value and (ids := _block_entries(list(value))) is not None:
                found += _scratch(where, len(value), ids, bound, idle=not live)
    return found


def _dead_keys(where: str, value: dict, live: set[str]) -> list[Violation]:
    keys = [k for k in value if isinstance(k, str)]
    dead = sorted(k for k in keys if k not in live)
    if not dead or len(keys) != len(value):
        return []
    detail = (
        f"{where} keeps {len(dead)} request ids the scheduler no longer knows (of {len(value)})"
    )
    return [violation(DEAD_REQUEST_KEY, detail, requests=dead[:NAMED])]


def _scratch(where: str, n: int, ids: tuple[int, ...], bound: int, idle: bool) -> list[Violation]:
    out = []
    if n > bound:
        detail = (
            f"{where} holds {n} entries, more than the pool's {bound} blocks "
            f"({len(set(ids))} distinct)"
        )
        out.append(violation(SCRATCH_OVER_POOL, detail, blocks=ids[:NAMED]))
    if idle:
        detail = f"{where} holds {n} entries with no live request"
        out.append(violation(SCRATCH_NOT_DRAINED, detail, blocks=ids[:NAMED]))
    return out
