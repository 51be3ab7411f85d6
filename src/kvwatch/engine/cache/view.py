"""CacheView: what the audit, the usage figures and the probe read, and nothing to write with.

The readers (audit.py, claims.py, usage.py, reads.py) recompute what the live
holders imply and compare it with what the cache holds. They get this view,
never the cache: the config, the tree (as ``TreeReads``: its structure and
counters), the device and host pools, the holders (a read-only mapping), and
``StoredReads``: what a backend keeps beyond the tree and its holders (the
slot table, the snapshots kept for queued requests)::

    CacheBase ──view──► CacheView(config, tree, pools, host_pools, holders, stored)
                             │
        audit(view)   group_usage(view)   usage_bounds(view, ...)   CacheReads(view)

The view is frozen and holds the live objects, not copies: read at a step
boundary, it is the cache at that moment.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from kvwatch.engine.cache.holder import Holder
from kvwatch.engine.cache.node import Node, Tier
from kvwatch.engine.cache.pool import PagePool
from kvwatch.engine.cache.radix import Walk
from kvwatch.engine.config import CacheConfig

if TYPE_CHECKING:
    from kvwatch.contracts import Finding, SlotReport
    from kvwatch.engine.cache.claims import Claims
    from kvwatch.engine.cache.slots import Slot


class TreeReads(Protocol):
    """The radix tree's structure and counters, read-only (``RadixTree`` is one)."""

    @property
    def page_size(self) -> int: ...

    @property
    def root(self) -> Node: ...

    @property
    def evictable(self) -> AbstractSet[Node]: ...

    @property
    def snapshot_nodes(self) -> AbstractSet[Node]: ...

    @property
    def node_count(self) -> int: ...

    @property
    def page_count(self) -> int: ...

    @property
    def state_pages(self) -> Counter[tuple[str, Tier]]: ...

    def nodes(self) -> list[Node]: ...

    def walk(self, tokens: list[int], extra_key: str | None, limit: int) -> Walk: ...


class StoredReads:
    """What a backend keeps beyond the tree and its holders, as the readers see it.

    The defaults are a backend that keeps nothing more (cache off); the radix
    and slot backends override what they keep. Every method is pure.
    """

    def claim(self, claims: Claims) -> None:
        """Register the backend's own stored pages with the audit's claims."""

    def findings(self) -> list[Finding]:
        """The backend's own consistency findings."""
        return []

    def evictable(self) -> dict[str, int]:
        """Pages of the backend's own storage that pressure or a flush may take back,
        by group (the pool gauges' ``evictable`` counts them beside the tree's)."""
        return {}

    def snapshots(self) -> list[Slot]:
        """Whole-state snapshots the backend keeps outside the tree (for the bound)."""
        return []

    def kept_for_waiters(self) -> frozenset[Node]:
        """Snapshots kept past their release for queued requests (shared, for the bound)."""
        return frozenset()

    def stopped_commits(self) -> list[str]:
        """Running holders whose commit stopped short of what they computed."""
        return []

    def slot_report(self) -> SlotReport | None:
        return None


@dataclass(frozen=True)
class CacheView:
    """A read-only window on one cache, at the moment it is read."""

    config: CacheConfig
    tree: TreeReads
    pools: Mapping[str, PagePool]
    host_pools: Mapping[str, PagePool]
    holders: Mapping[int, Holder]
    stored: StoredReads

    @property
    def page_size(self) -> int:
        return self.config.page_size
