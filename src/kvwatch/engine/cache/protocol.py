"""The cache's contracts: what the scheduler and runner call, and two capabilities beside it.

* ``PrefixCache``: the calls a scheduler and a runner make (below);
* ``BranchPromises``: prefix waits, a queued request waiting to branch off a
  running one's path and the states kept for it (``prefix_wait.py`` and the
  scheduler's end-of-step promise);
* ``AuditableCache``: the pure reads a probe takes (the audit, usage, structure).

A backend is a ``ServedCache``: a ``PrefixCache`` that hands out the other two
as parts (``branches``, ``reads``), over a read-only ``view`` (view.py). Each
caller is handed only the one it needs, so a scheduler change cannot quietly
start reading the audit, nor the probe start mutating.

A request's life through it, each call made at a step boundary::

    open ─► match ─┬─► allocate ─► [runner computes] ─► advance ─► commit_chunk ─┐
       (or resume) │        ▲                                                    │
                   │        └────────────────────────────────────────────────────┘
                   ├─► trim          (speculative slots that were not accepted)
                   ├─► retract ─► match again (recovery) ─► allocate ...
                   ├─► park ─► resume                      (a session between turns)
                   └─► release(commit=True | False)

``open`` hands out a ``Handle``: an opaque ticket that only says who it is
and how far it got (``status``, ``cached_len``, ``computed_len``,
``allocated_len``, and ``keeps_recovery`` while retracted). Pages, locks and
snapshots stay behind it, in the backend. Each method's docstring says
whether it mutates; those that do deliver their events only once the
mutation is complete.

Backends (chosen once, by ``CacheConfig.mode``, in ``build_cache``):
``RadixPrefixCache`` (a radix tree with state recovery), ``SlotPrefixCache``
(a small table of whole-state snapshots), ``NoPrefixCache`` (nothing is
shared: the cache-off baseline).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

import torch

from kvwatch.engine.cache.holder import Handle, PendingKind, holder_of
from kvwatch.engine.cache.owner import OwnerKind

if TYPE_CHECKING:
    from kvwatch.contracts import Bound, RootRefs, SlotReport, TreeReport
    from kvwatch.engine.cache.audit import AuditReport
    from kvwatch.engine.cache.failpoints import Failpoints
    from kvwatch.engine.cache.pool import PagePool
    from kvwatch.engine.cache.usage import GroupUsage
    from kvwatch.engine.cache.view import CacheView

__all__ = [
    "AuditableCache",
    "BranchPromises",
    "Capture",
    "Handle",
    "Match",
    "PageTable",
    "PrefixCache",
    "ProbeReads",
    "ServedCache",
    "holder_of",
]


class Match(NamedTuple):
    hit_len: int  # tokens found in the cache's history
    resume_len: int  # tokens the holder skips: depth of its restored state
    # where the tokens first differ from the cached history, to the token (None: hit_len)
    branch_len: int | None = None


class Capture(NamedTuple):
    """A continuation snapshot the runner computed inside an advanced range."""

    boundary: int
    kind: PendingKind
    linear_state: torch.Tensor  # the L layers' state after token ``boundary - 1``


class PageTable(NamedTuple):
    """Where a holder's tokens live, for the model to read and write."""

    full: list[int]  # full.kv page of every P tokens, [0, allocated_len)
    swa: dict[int, int]  # swa.kv page index -> page id, the window's pages only
    linear: int  # the linear.state entry of the working state


class ProbeReads(NamedTuple):
    """What a probe reads from the cache at a step boundary (all pure)."""

    audit: AuditReport
    usage: dict[str, GroupUsage]
    bounds: dict[str, Bound]
    tree: TreeReport
    slot_report: SlotReport | None
    root_refs: RootRefs
    stopped_commits: tuple[str, ...]  # running holders whose commit fell short, described


class PrefixCache(ABC):
    """The calls the scheduler, the runner and the engine make on a request's pages."""

    page_size: int

    # -- lifecycle (mutating) -------------------------------------------------------
    @abstractmethod
    def open(
        self,
        tokens: list[int],
        *,
        extra_key: str | None = None,
        kind: OwnerKind = OwnerKind.REQUEST,
        snapshot_at: int | None = None,
        label: str = "",
    ) -> Handle:
        """A NEW holder over the caller's ``tokens`` list (read, never written)."""

    @abstractmethod
    def match(self, h: Handle) -> Match:
        """Mutates: lock the deepest usable cached prefix and restore its state.
        Raises ``PoolExhausted`` holding nothing new."""

    @abstractmethod
    def resume(self, h: Handle) -> int | None:
        """Mutates: reopen a parked session slot; where computing resumes, or
        ``None`` when the slot starts over (then ``match`` it)."""

    @abstractmethod
    def allocate(self, h: Handle, n: int) -> None:
        """Mutates: pages for the next ``n`` tokens; ``PoolExhausted`` allocates nothing."""

    @abstractmethod
    def capture_points(self, h: Handle, start: int, end: int) -> list[tuple[int, PendingKind]]:
        """Pure: boundaries in (start, end] where the runner must capture state."""

    @abstractmethod
    def set_working_state(self, h: Handle, state: torch.Tensor) -> None:
        """Mutates: the holder's working linear state after its computed tokens."""

    @abstractmethod
    def advance(self, h: Handle, new_len: int, captures: Sequence[Capture] = ()) -> None:
        """Mutates: tokens up to ``new_len`` are computed; take the captures."""

    @abstractmethod
    def trim(self, h: Handle, keep_len: int) -> None:
        """Mutates: free what was allocated beyond ``keep_len`` (rejected drafts)."""

    @abstractmethod
    def commit_chunk(self, h: Handle, terminal: bool = False) -> int:
        """Mutates: share what the holder computed; returns tokens newly shared."""

    @abstractmethod
    def retract(self, h: Handle) -> None:
        """Mutates: give a running holder's pages back under pressure; it
        recovers through ``match``."""

    @abstractmethod
    def park(self, h: Handle) -> None:
        """Mutates: a session's turn ends; its slot keeps everything."""

    @abstractmethod
    def end_turn(self, h: Handle) -> None:
        """Mutates: the session recorded a turn end; a parked slot's frontier
        snapshot becomes a turn end (what a rollback returns to)."""

    @abstractmethod
    def settle(self, h: Handle, limit: int) -> None:
        """Mutates: a parked slot's computed tokens come back to at most ``limit``."""

    @abstractmethod
    def release(self, h: Handle, *, commit: bool) -> None:
        """Mutates: finish (``commit``) or abort a holder for good."""

    # -- pressure (mutating) ------------------------------------------------------------
    @abstractmethod
    def drop_parked(self) -> bool:
        """Mutates: empty the parked slot held longest; False if none is parked."""

    @abstractmethod
    def flush(self) -> None:
        """Mutates: drop everything no live holder uses."""

    # -- reads --------------------------------------------------------------------------
    @property
    @abstractmethod
    def pools(self) -> Mapping[str, PagePool]:
        """The device pools the model computes over (by group)."""

    @abstractmethod
    def page_table(self, h: Handle) -> PageTable:
        """Pure: where the holder's tokens live."""

    @abstractmethod
    def read_aux(self, h: Handle, name: str) -> torch.Tensor:
        """Pure: an auxiliary full.kv field (routed experts) for the computed tokens."""


class BranchPromises(ABC):
    """Prefix waits: queued requests that wait to branch off a running one's path,
    and the states the cache keeps for them until no waiter wants them."""

    @property
    @abstractmethod
    def branch_waits(self) -> bool:
        """Whether queued requests can wait to branch off a running one."""

    @abstractmethod
    def promise(self, points: Mapping[int, frozenset[int]], wanted: set[object]) -> None:
        """Mutates: this step's promised branch points (holder id -> depths) and the
        kept states queued requests still want (from ``kept_on_path``)."""

    @abstractmethod
    def promised_by(self, h: Handle) -> frozenset[int]:
        """Pure: depths where queued requests wait to branch off ``h``'s path."""

    @abstractmethod
    def keeps_for_waiters(self) -> bool:
        """Pure: whether any promise or kept state is outstanding."""

    @abstractmethod
    def kept_on_path(self, tokens: list[int], extra_key: str | None, limit: int) -> set[object]:
        """Pure: the kept-for-waiters states on the path of ``tokens[:limit]``."""


class AuditableCache(ABC):
    """What a probe reads at a step boundary; every call is pure."""

    @abstractmethod
    def probe(self, slack_tokens: int) -> ProbeReads:
        """Pure: the audit, usage, bounds and structure figures, at one moment."""

    @abstractmethod
    def usage(self) -> dict[str, GroupUsage]:
        """Pure: per-group usage by owner, without the audit (cheap)."""

    @abstractmethod
    def structure(self) -> tuple[TreeReport, SlotReport | None, RootRefs]:
        """Pure: tree and slot figures and the root's refs (as counted, not audited)."""


class ServedCache(PrefixCache):
    """A backend (``build_cache`` returns one): ``PrefixCache`` itself, and the
    other two contracts as parts it hands out, with the read-only view they
    stand on and the failpoint schedule (a testing aid)."""

    @property
    @abstractmethod
    def branches(self) -> BranchPromises:
        """The branch promises prefix waits call (nothing is promised without sharing)."""

    @property
    @abstractmethod
    def reads(self) -> AuditableCache:
        """The probe's reads."""

    @property
    @abstractmethod
    def view(self) -> CacheView:
        """Pure: the cache read-only (the tree, pools, holders, what the backend
        stores), for the audit and usage figures."""

    @property
    @abstractmethod
    def failpoints(self) -> Failpoints:
        """The failpoint schedule: ``arm`` it between steps, ``fail_next`` a site."""
