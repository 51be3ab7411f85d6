"""What the white-box checks read of a live vLLM scheduler, duck-typed.

The KV cache groups and their managers, the block pools in the order groups use
them (numbered as the audit numbers them), the tokens per hash, a request's
block table and the cached blocks in it, and the keys a block is filed under.
Only reads, and imports nothing from vLLM: it runs in vLLM's engine core
between two steps or in the driver's process after each ``schedule()``.
"""

from __future__ import annotations

from collections.abc import Iterator


def group_managers(scheduler) -> list[tuple[int, object]]:
    """(group id, single-type manager) of each KV cache group."""
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    return [(getattr(m, "kv_cache_group_id", i), m) for i, m in enumerate(managers)]


def pool_index(scheduler) -> dict[int, int]:
    """id(block pool) -> its number, in the order groups use them (as the audit numbers them)."""
    out: dict[int, int] = {}
    for _, manager in group_managers(scheduler):
        out.setdefault(id(manager.block_pool), len(out))
    return out


def hash_block_size(scheduler) -> int | None:
    """Tokens per hash: the scheduler's, its manager's or its coordinator's."""
    kv = scheduler.kv_cache_manager
    for holder in (scheduler, kv, getattr(kv, "coordinator", None)):
        size = getattr(holder, "hash_block_size", None)
        if isinstance(size, int) and size > 0:
            return size
    return None


def raw_hash(key):
    """A block's key without its group: vLLM appends 4 bytes of group id to the hash."""
    if isinstance(key, bytes) and len(key) > 4:
        return key[:-4]
    return getattr(key, "block_hash", key)


def table(manager, request_id: str) -> list:
    """The blocks ``manager`` holds for ``request_id`` (none when it holds nothing)."""
    blocks = manager.req_to_blocks
    return list(blocks.get(request_id, ())) if hasattr(blocks, "get") else []


def cached_blocks(block_list) -> Iterator[tuple[int, object]]:
    """(index, block) of the blocks that carry a hash (cached, full), null slots left out."""
    for i, block in enumerate(block_list):
        if not getattr(block, "is_null", False) and block.block_hash is not None:
            yield i, block


def extra_keys(manager, block) -> tuple:
    """The keys ``block`` carries besides its ``block_hash`` (partial entries, moved keys)."""
    extra = getattr(manager.block_pool, "cached_block_hashes_by_block", None) or {}
    return tuple(extra.get(block.block_id, ()))
