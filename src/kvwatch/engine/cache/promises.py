"""Promises: branch points running holders keep state at for queued requests.

Each step the scheduler names, per running holder, the depths where queued
requests wait to branch off its path (prefix_wait.py). The holder captures a
``BRANCH`` snapshot there, and release of superseded snapshots keeps it
(``kept``) while a queued request still wants it::

    step n     promise {q: {496}}        q captures at 496, keeps it
    step n+1   promise {}, wanted {496}  the waiter is still queued: kept
    step n+2   promise {}, wanted {}     lapsed: superseded again

This object only keeps the two sets; what a lapse frees is the radix
backend.s call (``RadixBranches.promise``, branches.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from kvwatch.engine.cache.node import Node


class Promises:
    def __init__(self) -> None:
        self._by_holder: dict[int, frozenset[int]] = {}
        self._kept: set[Node] = set()  # snapshots release skipped for a promise

    def promised_by(self, holder_id: int) -> frozenset[int]:
        """Depths where queued requests wait to branch off that holder's path."""
        return self._by_holder.get(holder_id, frozenset())

    def keep(self, node: Node) -> None:
        """Release skipped ``node``'s snapshot because a waiter wants it."""
        self._kept.add(node)

    def is_kept(self, node: Node) -> bool:
        return node in self._kept

    @property
    def kept(self) -> frozenset[Node]:
        return frozenset(self._kept)

    @property
    def outstanding(self) -> bool:
        """Whether any promise or kept snapshot stands."""
        return bool(self._by_holder or self._kept)

    def replace(self, points: Mapping[int, frozenset[int]], wanted: set[Node]) -> list[Node]:
        """This step's promises; returns the kept nodes no queued request wants any more."""
        self._by_holder = dict(points)
        lapsed = self._kept - wanted
        self._kept &= wanted
        return list(lapsed)
