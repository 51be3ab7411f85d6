"""vLLM's KV cache events checked against the block pool they describe.

With ``kv_events_config.enable_kv_cache_events`` vLLM's ``BlockPool`` queues
an event for each change of its prefix index (``cached_block_hash_to_block``):
``BlockStored`` when blocks get keys (``cache_full_blocks``,
``cache_partial_block``), ``BlockRemoved`` for each key dropped (eviction in
``get_new_blocks``, ``evict_blocks``, a partial entry promoted or replaced),
``AllBlocksCleared`` on ``reset_prefix_cache``. The scheduler takes them at
the end of ``update_from_output`` and publishes them as one ``KVEventBatch``;
routers and KV-aware gateways rebuild the index from that stream.

``EventLedger`` is such a consumer, kept exact: per (group, hash) the number
of blocks the stream says carry that key (each key in a ``BlockStored`` adds
one, each in a ``BlockRemoved`` takes one, ``AllBlocksCleared`` empties it).
Right after a batch is published the pool's queue is empty, so the ledger
must equal the pool's index, key by key (``check``). Rules:

``event-removed-unstored``  a ``BlockRemoved`` names a key the stream holds on
                            no block: a removal with no store, or a second
                            removal (``REF_MISMATCH``: the stream's per-key
                            balance is a count of holders, and it went below
                            zero, as a ref count taken with no holder)
``event-stored-not-held``   after a batch the stream holds a key on more blocks
                            than the pool's index does: a removal never sent,
                            or a store for a block the pool never indexed
                            (``TREE``: the published prefix index disagrees
                            with the index, so a router sends requests for KV
                            that is gone)
``event-unannounced``       the pool's index holds a key on more blocks than
                            the stream does: a store never sent, or a removal
                            sent while another block still carries the key
                            (``TREE``, the same index the other way)

Known limits: requests in ``kv_cache_report_mode="full"`` re-announce the
blocks of every prefix hit with ``BlockStored`` (no block changes), which
this count cannot tell from a new block; the driver never sets that mode. A
KV connector's own events are another medium and are not counted.

Duck-typed (event classes by name, their ``block_hashes`` and ``group_idx``;
the pool's ``cached_block_hash_to_block``): nothing is imported from vLLM.
``convert`` maps a pool hash (bytes, no group id) to the events' form
(vLLM's ``maybe_convert_block_hash``: bytes, or a 64-bit int).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from kvwatch.targets.vllm.manager_audit import (
    EVENT_REMOVED_UNSTORED,
    EVENT_STORED_NOT_HELD,
    EVENT_UNANNOUNCED,
    Violation,
    hash_entries,
)

Key = tuple[int | None, object]  # (group, external hash)


def _same(value):
    return value


def short(value) -> str:
    """An external hash in short form (bytes as hex, an int as hex)."""
    if isinstance(value, bytes):
        return value[:6].hex()
    return f"{value:x}"[:12] if isinstance(value, int) else repr(value)[:12]


def pool_keys(pool, convert: Callable = _same) -> dict[Key, list[int]]:
    """(group, external hash) -> the ids of the blocks ``pool``'s index files under it."""
    held: dict[Key, list[int]] = {}
    for key, block in hash_entries(pool):
        group = int.from_bytes(key[-4:], "big") if isinstance(key, bytes) else None
        raw = key[:-4] if isinstance(key, bytes) else key
        held.setdefault((group, convert(raw)), []).append(block.block_id)
    return held


class EventLedger:
    """The prefix index as the event stream tells it (see the module docstring)."""

    def __init__(self, convert: Callable = _same) -> None:
        self.convert = convert
        self.counts: Counter = Counter()
        self.seen: Counter = Counter()  # events by class name, and keys stored/removed

    def take(self, events: Iterable) -> list[Violation]:
        """Apply ``events`` in order; the removals of keys the stream does not hold."""
        found: list[Violation] = []
        for event in events:
            kind = type(event).__name__
            self.seen[kind] += 1
            if kind == "AllBlocksCleared":
                self.counts.clear()
            elif kind == "BlockStored":
                for value in event.block_hashes:
                    self.counts[(getattr(event, "group_idx", None), value)] += 1
                    self.seen["keys stored"] += 1
            elif kind == "BlockRemoved":
                found += self._removed(event)
        return found

    def _removed(self, event) -> list[Violation]:
        group, found = getattr(event, "group_idx", None), []
        for value in event.block_hashes:
            self.seen["keys removed"] += 1
            key = (group, value)
            if self.counts[key] > 0:
                self.counts[key] -= 1
                continue
            del self.counts[key]
            detail = (
                f"BlockRemoved for hash {short(value)} (group {group}), which the event "
                f"stream holds on no block: removed with no store, or removed twice"
            )
            subject = f"removal of {short(value)}@g{group}"
            found.append(
                Violation(rule=EVENT_REMOVED_UNSTORED, detail=detail, blocks=(), subject=subject)
            )
        return found

    def check(self, pools: Iterable) -> list[Violation]:
        """The stream's keys against the pools' indexes, right after a batch."""
        held: dict[Key, list[int]] = {}
        for pool in pools:
            for key, ids in pool_keys(pool, self.convert).items():
                held.setdefault(key, []).extend(ids)
        self.counts = +self.counts  # drop zero entries
        found = []
        for key in sorted(set(self.counts) | set(held), key=repr):
            if self.counts[key] != len(held.get(key, ())):
                found.append(_mismatch(key, self.counts[key], held.get(key, [])))
        return found

    def totals(self) -> dict[str, int]:
        """Events seen by kind, keys stored and removed, keys the stream holds now."""
        return {**dict(self.seen), "keys held": sum(self.counts.values())}


def _mismatch(key: Key, told: int, blocks: list[int]) -> Violation:
    group, value = key
    has = len(blocks)
    rule = EVENT_STORED_NOT_HELD if told > has else EVENT_UNANNOUNCED
    if told > has:
        why = "a removal was never sent, or a store named a block the pool never indexed"
    else:
        why = "a store was never sent, or a removal was sent while a block still carries it"
    detail = (
        f"hash {short(value)} (group {group}): the event stream holds it on {told} block(s), "
        f"the pool's prefix index on {has}: {why}"
    )
    subject = f"{short(value)}@g{group}"
    return Violation(rule=rule, detail=detail, blocks=tuple(sorted(blocks)), subject=subject)
