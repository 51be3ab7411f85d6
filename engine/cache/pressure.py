"""CachePressure: what the prefix cache gives back when a pool runs short.

``CacheStorage`` prunes snapshots and evicts LRU leaves. On top of that:

* ``make_room`` lets go of retracted holders' recovery nodes, oldest first,
  when nothing unreferenced is left (their holders then recover from a
  shallower snapshot), and finally evicts slot-cache snapshots;
* ``evict`` releases the state of a parent that eviction leaves with one
  child: it is no longer a branch point, so its state is superseded again.

Mixed into ``HybridPrefixCache``: needs ``self.holders`` and ``self.slots``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvwatch.engine.cache import slotcache
from kvwatch.engine.cache.commit import release_unbranched
from kvwatch.engine.cache.node import Node, Tier
from kvwatch.engine.cache.storage import CacheStorage
from kvwatch.engine.faults import Fault

if TYPE_CHECKING:
    from kvwatch.engine.cache.holder import Holder
    from kvwatch.engine.cache.slots import SlotTable


class CachePressure(CacheStorage):
    holders: dict[int, Holder]
    slots: SlotTable | None

    def make_room(self, group: str, wanted: int, tier: Tier = Tier.DEVICE) -> int:
        """Prune and evict; as a last resort, give up retracted holders' recovery nodes.

        A host ref keeps a recovery snapshot safe from the superseded-snapshot
        release, not from real pressure: when nothing unreferenced is left, the
        least recently used recovery node that no running holder uses is let
        go, and its holders will recover from a shallower snapshot.
        """
        got = super().make_room(group, wanted, tier)
        while got < wanted and (node := self._oldest_recovery_node(tier)) is not None:
            for holder in self.holders.values():
                if holder.anchor is node:
                    self.tree.drop_host_ref(node)
                    holder.anchor = None
            got += super().make_room(group, wanted - got, tier)
        if got < wanted and self.slots is not None and tier is Tier.DEVICE:
            got += slotcache.make_room(self, group, wanted - got)
        return got

    def flush(self) -> None:
        super().flush()
        if self.slots is not None:
            slotcache.flush(self)

    def _oldest_recovery_node(self, tier: Tier) -> Node | None:
        nodes = {
            h.anchor
            for h in self.holders.values()
            if h.anchor is not None and h.anchor.refs == 0 and h.anchor.snapshot.tier is tier
        }
        return min(nodes, key=lambda n: (n.last_access, n.id), default=None)

    def evict(self, group: str, wanted: int) -> int:
        """Evict LRU unreferenced leaves (see ``CacheStorage.evict``).

        A parent left with one child is no longer a branch point: its state is
        superseded again. Unreferenced, it goes now; on live holders' paths it
        goes as their release of superseded snapshots decides.
        """
        parents: list[Node] = []

        def release(node: Node) -> int:
            parents.append(node.parent)
            return self._release_node(node, group)

        got = self.tree.evict(wanted, release)
        if Fault.INTERIOR_SNAPSHOT_LEAK not in self.faults:
            got += release_unbranched(self, parents, group)
        return got
