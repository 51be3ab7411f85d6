"""Claims: who holds which pages, gathered for the audit's vectorised pool pass.

The audit walks the tree and the holders once; every node, holder and slot
registers as a claimant and adds its page-id arrays per (group, tier). The
pool pass then sees, per (group, tier), every claimed page and its claimant::

    runs       [node 7: 3 pages][node 9: 2 pages][holder 4: 1 page]
    pages      [ 12 13 14       | 30 31          | 55             ]
    claimants  [ 0              | 1              | 2              ]   (per run)
    lengths    [ 3              | 2              | 1              ]   (per run)

A claimant's expected owner tag is ``owner_key`` of its ``Owner``.
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import attrgetter
from typing import NamedTuple

import numpy as np

from kvwatch.engine.cache.holder import Holder
from kvwatch.engine.cache.node import Node, Tier
from kvwatch.engine.cache.owner import OWNER_LABEL, Owner, OwnerKind
from kvwatch.engine.cache.slots import Slot

EMPTY = np.empty(0, dtype=np.int64)


class ClaimRuns(NamedTuple):
    """One (group, tier)'s claims: every claimed page id, and per claimant run
    the claimant index and the run's length (``pages`` is the runs concatenated)."""

    pages: np.ndarray
    claimants: np.ndarray
    lengths: np.ndarray

    def who(self) -> np.ndarray:
        """The claimant index of every page in ``pages``."""
        return np.repeat(self.claimants, self.lengths)


class Claims:
    """Who holds which pages, per (group, tier), as parallel numpy arrays.

    Every claimant (a node or a holder) gets an index into ``who``; each
    (group, tier) keeps its page-id arrays, the claimant index of each and
    its length.
    """

    def __init__(self) -> None:
        self.pages: dict[tuple[str, Tier], list[np.ndarray]] = {}
        self.claimant: dict[tuple[str, Tier], list[int]] = {}
        self.lengths: dict[tuple[str, Tier], list[int]] = {}
        # parallel lists, not (owner, who) tuples: a million-page tree has tens of
        # thousands of claimants, and that many tuples would wake the collector
        self.owners: list[Owner] = []
        self.who: list[Node | Holder | Slot] = []

    def register(self, owner: Owner, who: Node | Holder | Slot) -> int:
        self.owners.append(owner)
        self.who.append(who)
        return len(self.who) - 1

    def add(self, group: str, tier: Tier, pages, claimant: int) -> None:
        ids = np.asarray(pages, dtype=np.int64)
        if ids.size:
            self.add_many(group, tier, [ids], [claimant], [ids.size])

    def add_many(
        self,
        group: str,
        tier: Tier,
        pages: list[np.ndarray],
        claimants: Iterable[int],
        lengths: Iterable[int],
    ) -> None:
        self.pages.setdefault((group, tier), []).extend(pages)
        self.claimant.setdefault((group, tier), []).extend(claimants)
        self.lengths.setdefault((group, tier), []).extend(lengths)

    def arrays(self, group: str, tier: Tier) -> ClaimRuns:
        parts = self.pages.get((group, tier))
        if not parts:
            return ClaimRuns(EMPTY, EMPTY, EMPTY)
        return ClaimRuns(
            np.concatenate(parts),
            np.asarray(self.claimant[group, tier], dtype=np.int64),
            np.asarray(self.lengths[group, tier], dtype=np.int64),
        )

    def owner_keys(self) -> np.ndarray:
        """``owner_key`` of every claimant, by claimant index."""
        n = len(self.owners)
        kinds = np.fromiter(map(attrgetter("kind"), self.owners), dtype=np.int64, count=n)
        ids = np.fromiter(map(attrgetter("id"), self.owners), dtype=np.int64, count=n)
        return owner_key(kinds, ids)

    def describe(self, index: int) -> str:
        owner, who = self.owners[index], self.who[index]
        if isinstance(who, Node):
            return f"node {who.id} (depth {who.depth})"
        return owner_name(owner, who if isinstance(who, Holder) else None)


def owner_key(kinds: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """One int64 per (owner kind, owner id): ids stay below 2**48."""
    return (kinds.astype(np.int64) << 48) | ids


def owner_name(owner: Owner, holder: Holder | None) -> str:
    """An owner as people know it: a request or session holder by the id its
    clients use (``session sess-0``, ``request req-12``), once closed by its
    number in the cache (``session 2 (closed)``); slots and nodes by number."""
    if owner.kind not in (OwnerKind.REQUEST, OwnerKind.SESSION):
        return str(owner)
    if holder is None:
        return f"{owner} (closed)"
    return f"{OWNER_LABEL[owner.kind]} {holder.label}" if holder.label else str(owner)
