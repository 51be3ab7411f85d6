"""``KvEventWatch``: SGLang's own KV cache events, and its tree, as a ``CacheWatch``.

SGLang publishes what its radix tree stores and removes as KV events
(``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``, each block named by
its page hash) for cache-aware routers, when a server runs with
``--kv-events-config``. The watch switches on the cache's own recorder
(``KVCacheEventRecorder``, 0.5.2x) and, after every step and abort (a loop
observer), logs what the recorder queued since, the requests that ended, and
the tree as it stands, each node named the way the recorder names it on its
removal (a second recorder of the release's, fed the node and never the
engine's queue). Device-tier events only; the host tier is not configured.

It tells the index only: SGLang's lock refs are taken with no request named,
so the ``references`` check is skipped.

Invariant: the watch reads the recorder's queue and the tree; the only change
it makes is the recorder's ``enabled`` flag, which every event site reads.
"""

from __future__ import annotations

from typing import Any

from kvwatch.targets.driver.cache_watch import (
    INDEX,
    CacheWatch,
    Cleared,
    Removed,
    RequestEnded,
    Seen,
    Stored,
)


def recorder_of(loop: Any) -> Any | None:
    """The cache's event recorder, where the release has one (0.5.2x)."""
    cache = loop.tree_cache
    core = getattr(cache, "tree_core", None)
    recorder = getattr(core if core is not None else cache, "kv_events", None)
    return recorder if hasattr(recorder, "record_remove") else None


def _device(event: Any) -> bool:
    medium = getattr(event, "medium", None)
    return medium is None or str(getattr(medium, "value", medium)) == "GPU"


class KvEventWatch(CacheWatch):
    tells = frozenset({INDEX})

    def __init__(self, loop: Any, recorder: Any) -> None:
        super().__init__()
        self.loop, self.recorder, self.seen = loop, recorder, 0
        recorder.enabled = True
        self.namer = type(recorder)(enabled=True, page_size=recorder.page_size)
        loop.observers.append(self._after)

    def _drain(self) -> None:
        for e in self.recorder.take():
            kind = type(e).__name__
            if kind == "AllBlocksCleared":
                self.log.append(Cleared())
            elif kind in ("BlockStored", "BlockRemoved") and _device(e):
                keys = tuple(e.block_hashes)
                self.log.append((Stored if kind == "BlockStored" else Removed)(keys, keys))

    def _after(self) -> None:
        self._drain()
        outcomes = self.loop.outcomes
        self.log.extend(RequestEnded(str(o.rid)) for o in outcomes[self.seen :])
        self.seen = len(outcomes)
        self.look(f"step {self.loop.steps}")

    def look(self, where: str) -> None:
        self._drain()
        index: dict[int, int] = {}
        stack = list(self.loop.tree_cache.root_node.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            self.namer.record_remove(node)
            for e in self.namer.take():
                index.update((k, k) for k in e.block_hashes)
        self.log.append(Seen(where, index, {}))
