"""The branch promises a backend answers prefix waits with (``BranchPromises``).

``RadixBranches`` (the radix backend): each step the scheduler names, per
running holder, the depths where queued requests wait to branch off its path
(prefix_wait.py); the holder captures a ``BRANCH`` snapshot there, and the
commit's release keeps it while a queued request still wants it. Once none
does, the promise lapses and the snapshot is superseded again
(``Commits.release_lone``). The sets themselves are ``Promises`` (promises.py).

``NoBranches``: a backend that shares no path (slots, cache off) promises
nothing, and queued requests never wait to branch.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvwatch.engine.cache.commit import Commits
from kvwatch.engine.cache.deferred import mutation
from kvwatch.engine.cache.holder import Handle
from kvwatch.engine.cache.node import Node
from kvwatch.engine.cache.promises import Promises
from kvwatch.engine.cache.protocol import BranchPromises
from kvwatch.engine.cache.radix import RadixTree
from kvwatch.engine.events import EventBus


class RadixBranches(BranchPromises):
    """Promises over one radix tree; a lapse frees through that backend's commits."""

    def __init__(
        self, promises: Promises, commits: Commits, tree: RadixTree, events: EventBus
    ) -> None:
        self._promises = promises
        self._commits = commits
        self._tree = tree
        self._events = events

    @property
    def branch_waits(self) -> bool:
        return True

    @mutation
    def promise(self, points: Mapping[int, frozenset[int]], wanted: set[object]) -> None:
        """Replace this step's promises (holder id -> depths where queued requests
        wait to branch off). A snapshot kept for a promise stays while a queued
        request still wants it (``wanted``), even after the holder that promised
        it has left; once none does, it is superseded again (``release_lone``)."""
        lapsed = self._promises.replace(points, {n for n in wanted if isinstance(n, Node)})
        self._commits.release_lone(lapsed)

    def promised_by(self, h: Handle) -> frozenset[int]:
        return self._promises.promised_by(h.id)

    def keeps_for_waiters(self) -> bool:
        return self._promises.outstanding

    def kept_on_path(self, tokens: list[int], extra_key: str | None, limit: int) -> set[object]:
        kept = self._promises.kept
        if not kept:
            return set()
        walk = self._tree.walk(tokens, extra_key, limit)
        return {n for n in walk.nodes if n in kept}


class NoBranches(BranchPromises):
    """Nothing is shared, so nothing is promised and nobody waits to branch."""

    @property
    def branch_waits(self) -> bool:
        return False

    def promise(self, points: Mapping[int, frozenset[int]], wanted: set[object]) -> None:
        """Nothing to promise where nothing is shared."""

    def promised_by(self, h: Handle) -> frozenset[int]:
        return frozenset()

    def keeps_for_waiters(self) -> bool:
        return False

    def kept_on_path(self, tokens: list[int], extra_key: str | None, limit: int) -> set[object]:
        return set()
