"""``EngineCacheWatch``: kvwatch's engine's tree events and its tree, as a ``CacheWatch``.

The tree tells its index page by page and every ref change with the holder
it was made for (``engine/cache/tree_events.py``); this watch logs them as
they come, and after every step and abort (a loop observer) logs the
requests that ended, then the tree as it is (``tree_events.index`` and each
node's refs).
"""

from __future__ import annotations

from kvwatch.engine import events
from kvwatch.engine.cache.tree_events import index
from kvwatch.targets.driver.cache_watch import (
    CacheWatch,
    RefsMoved,
    Removed,
    RequestEnded,
    Seen,
    Split,
    Stored,
)
from kvwatch.targets.kvwatch.loop import KvwatchLoop


class EngineCacheWatch(CacheWatch):
    def __init__(self, loop: KvwatchLoop) -> None:
        super().__init__()
        self.loop, self.seen = loop, 0
        log, bus = self.log, loop.core.events
        bus.subscribe(events.PagesStored, lambda e: log.append(Stored(e.keys, e.page_ids)))
        bus.subscribe(events.PagesRemoved, lambda e: log.append(Removed(e.keys, e.page_ids)))
        bus.subscribe(events.RefsMoved, lambda e: log.append(RefsMoved(*e)))
        bus.subscribe(events.NodeSplit, lambda e: log.append(Split(*e)))
        loop.observers.append(self._after)

    def _after(self) -> None:
        outcomes = self.loop.outcomes
        self.log.extend(RequestEnded(str(o.rid)) for o in outcomes[self.seen :])
        self.seen = len(outcomes)
        self.look(f"step {self.loop.steps}")

    def look(self, where: str) -> None:
        tree = self.loop.core.cache_view.tree
        refs = {n.id: n.refs for n in tree.nodes() if n.refs}
        self.log.append(Seen(where, index(tree), refs))
