"""RecoveryNodes: the radix backend's last resort when a pool runs short.

``CacheStorage`` prunes snapshots and evicts LRU leaves. A retracted holder's
host ref keeps its recovery snapshot safe from the superseded-snapshot
release, not from real pressure: when nothing unreferenced is left, the least
recently used recovery node that no running holder uses is let go (its
holders will recover from a shallower snapshot), and pruning and eviction run
again::

    make_room(g, n):  prune ─► evict ─► [recovery node ─► prune ─► evict]* ─► short
"""

from __future__ import annotations

from collections.abc import Mapping

from kvwatch.engine.cache.holder import Holder
from kvwatch.engine.cache.node import Node, Tier
from kvwatch.engine.cache.storage import CacheStorage


class RecoveryNodes:
    """A ``Reclaimer`` over the retracted holders of one backend."""

    def __init__(self, store: CacheStorage, holders: Mapping[int, Holder]) -> None:
        self.store = store
        self.holders = holders

    def __call__(self, group: str, wanted: int, tier: Tier) -> int:
        got = 0
        while got < wanted and (node := self._oldest(tier)) is not None:
            for holder in self.holders.values():
                if holder.anchor is node:
                    self.store.tree.drop_host_ref(node)
                    holder.anchor = None
            got += self.store.prune_and_evict(group, wanted - got, tier)
        return got

    def _oldest(self, tier: Tier) -> Node | None:
        nodes = {
            h.anchor
            for h in self.holders.values()
            if h.anchor is not None and h.anchor.refs == 0 and h.anchor.snapshot.tier is tier
        }
        return min(nodes, key=lambda n: (n.last_access, n.id), default=None)
