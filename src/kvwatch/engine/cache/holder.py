"""Holder: one request's (or session's) view of the cache, and the Handle that fronts it.

A holder borrows the tree pages of its locked path and owns everything it has
computed beyond it::

    positions  0 ........ cached_len ........ computed_len ...... allocated_len
    full.kv    [ tree pages, borrowed  ][ own pages, computed   ][ own, not yet ]
    swa.kv                     [ own pages for the last W positions ][ own ]
    lock       path root → lock_node (lock_node.depth == cached_len)

Its page tables (``full_pages``, ``swa_pages``, ``working``) are a record
only: the per-group classes (full_attention.py, sliding_window.py,
linear_state.py) fill and empty them.

``pending`` holds continuation snapshots the holder captured but has not yet
handed to the tree. A ``TRACK`` snapshot follows the frontier (it is re-keyed
to each newer page boundary and becomes the terminal snapshot when a turn
ends); ``INTERVAL``, ``BRANCH`` and ``TERMINAL`` snapshots wait for the next
commit. ``branch_at`` is the depth where the prompt left the tree when it
matched, if no snapshot was there to resume from (captured as ``BRANCH``,
like the points the cache's promises name for it). In
``slots`` mode a ``SLOT`` pending is a whole-state copy waiting for confirm.

A ``Handle`` is what callers hold: it reads who and how far, never pages or
locks. Both live here, so the record and its ticket know each other without
an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from kvwatch.engine.cache.node import Node
from kvwatch.engine.cache.owner import Owner, OwnerKind
from kvwatch.engine.cache.slots import SlotTicket


class HolderStatus(StrEnum):
    NEW = "new"  # opened, not matched yet: holds nothing
    ACTIVE = "active"  # matched: holds a lock (maybe empty) and pages
    RETRACTED = "retracted"  # holds only a host ref on its recovery node
    PARKED = "parked"  # a session between turns: keeps lock, pages and state
    RELEASED = "released"  # holds nothing, forever


class PendingKind(StrEnum):
    TRACK = "track"
    INTERVAL = "interval"
    TERMINAL = "terminal"
    BRANCH = "branch"  # where the prompt leaves the tree: siblings branching here resume from it
    SLOT = "slot"  # a whole-state copy staged for the slot cache (slots mode)


@dataclass(slots=True)
class Pending:
    boundary: int
    pages: dict[str, np.ndarray]
    kind: PendingKind


@dataclass(eq=False)
class Holder:
    id: int
    owner: Owner
    tokens: list[int]
    extra_key: str | None = None
    label: str = ""  # the id clients know it by (its session's, or its request's); audits name it
    status: HolderStatus = HolderStatus.NEW
    lock_node: Node | None = None
    anchor: Node | None = None  # host-ref'd recovery node while retracted
    cached_len: int = 0
    computed_len: int = 0
    allocated_len: int = 0
    full_pages: list[int] = field(default_factory=list)
    swa_pages: dict[int, int] = field(default_factory=dict)  # page index -> page id
    working: dict[str, np.ndarray] = field(default_factory=dict)
    pending: dict[int, Pending] = field(default_factory=dict)
    branch_at: int = 0  # capture a BRANCH snapshot here (0: none)
    snapshot_at: int | None = None  # slots mode: the prompt's last turn boundary
    slot_ticket: SlotTicket | None = None  # slots mode: the prepared snapshot
    handle: Handle | None = field(default=None, repr=False)  # what ``open`` gave out

    def own_full_pages(self, page_size: int) -> list[int]:
        """The ``full.kv`` pages this holder owns (beyond its borrowed prefix)."""
        return self.full_pages[self.cached_len // page_size :]

    def track(self) -> Pending | None:
        for pend in self.pending.values():
            if pend.kind is PendingKind.TRACK:
                return pend
        return None


@dataclass(frozen=True, eq=False)
class Handle:
    """A request's (or session's) ticket into the cache: who, and how far.

    The fields behind it are the backend's; a handle only reads them, so a
    caller can follow progress but never change or see pages and locks.
    """

    _holder: Holder = field(repr=False)

    @property
    def id(self) -> int:
        return self._holder.id

    @property
    def kind(self) -> OwnerKind:
        return self._holder.owner.kind

    @property
    def status(self) -> HolderStatus:
        return self._holder.status

    @property
    def cached_len(self) -> int:
        """Tokens borrowed from the cache (shared, read-only)."""
        return self._holder.cached_len

    @property
    def computed_len(self) -> int:
        """Tokens whose K/V and state are written."""
        return self._holder.computed_len

    @property
    def allocated_len(self) -> int:
        """Tokens with pages, computed or not yet."""
        return self._holder.allocated_len

    @property
    def keeps_recovery(self) -> bool:
        """Retracted, and still keeping its recovery point (a host ref that keeps
        the node's path in the cache). A queued holder pins nothing else: one
        opened but never matched, or retracted with nothing to recover from."""
        holder = self._holder
        return holder.status is HolderStatus.RETRACTED and holder.anchor is not None


def holder_of(handle: Handle) -> Holder:
    """The record behind a handle: for backends, the audit and white-box tests."""
    return handle._holder
