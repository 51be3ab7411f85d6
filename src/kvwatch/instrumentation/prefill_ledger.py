"""PrefillLedger: which prompt tokens fall outside the prefill identity, and the
engine's evictions by kind, from the engine's events, apart from ``metrics.py``.

The identity the counter-truth oracle holds the prefix-cache and prefill
counters to: a request whose first admission ran its prompt to the end (its
first output token came, or it finished, before any retraction, pause, abort
or failure) was *queried* for its whole prompt, *hit* for the tokens it
skipped (``RequestScheduled.cached_tokens``) and *computed* the rest in its
prefill chunks, so for those requests ``queried = hit + computed`` exactly.
This ledger counts everything that is not such a request's, so the identity
stays exact over a whole run::

    uncovered queried   prompt tokens of first admissions cut before their
                        prefill ended (retracted, aborted or failed mid-prefill)
    uncovered hit       those admissions' cached tokens
    recomputed          chunk tokens outside a covered first admission: the cut
                        admissions' chunks, and every chunk after a retraction
                        or a pause (the recovery recomputes, prompt and output)
    covered             requests the identity covers (so a test can see it is
                        not vacuous)

It never counts the covered requests' own tokens: those come only from the
counters, so a listener or an event payload that lies about them shows.

Evictions by kind, for ``kvwatch_evictions_total``: ``node`` every
``NodeEvicted``; ``snapshot`` every ``SnapshotReleased`` the cache took back
(``pruned`` under pressure, ``evicted`` with its node, ``flushed``), not one
a deeper snapshot ``superseded``. Slot evictions are the slot machine's
``-> evicted (...)`` edges (``lifecycle.py``).

It only listens; per live request it keeps a prompt length, a cached count
and a chunk sum, dropped when the request ends.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

from kvwatch.engine.events import (
    EventBus,
    NodeEvicted,
    PrefillChunk,
    RequestAborted,
    RequestAdded,
    RequestFailed,
    RequestFinished,
    RequestPaused,
    RequestRetracted,
    RequestScheduled,
    SnapshotReleased,
    TokensGenerated,
)

PREFILL = "prefill tokens"  # its key in ``GET /debug/coverage``
EVICTIONS = "evictions"
SNAPSHOT_EVICTED = frozenset({"pruned", "evicted", "flushed"})


@dataclass(slots=True)
class _Admission:
    prompt: int
    cached: int = 0
    chunks: int = 0  # chunk tokens of the first admission so far
    first: bool = False  # in its first admission, prefill not ended yet


class PrefillLedger:
    """One writer (the engine thread); ``taken`` copies under a lock."""

    __bounded__ = MappingProxyType({"counts": 8})

    def __init__(self, events: EventBus) -> None:
        self.counts: Counter[tuple[str, str]] = Counter(
            {
                (PREFILL, "uncovered queried"): 0,
                (PREFILL, "uncovered hit"): 0,
                (PREFILL, "recomputed"): 0,
                (PREFILL, "covered"): 0,
                (EVICTIONS, "node"): 0,
                (EVICTIONS, "snapshot"): 0,
            }
        )
        self.live: dict[str, _Admission] = {}
        self._lock = threading.Lock()
        handlers: dict[type, Callable] = {
            RequestAdded: self._added,
            RequestScheduled: self._scheduled,
            PrefillChunk: self._chunk,
            TokensGenerated: lambda e: self._prefilled(e.request_id),
            RequestFinished: lambda e: self._ended(e.request_id, prefilled=True),
            RequestRetracted: lambda e: self._cut(e.request_id),
            RequestPaused: lambda e: self._cut(e.request_id),
            RequestAborted: lambda e: self._ended(e.request_id, prefilled=False),
            RequestFailed: lambda e: self._ended(e.request_id, prefilled=False),
            NodeEvicted: lambda e: self._add(EVICTIONS, "node", 1),
            SnapshotReleased: self._released,
        }
        self._unsubscribe = [events.subscribe(t, h) for t, h in handlers.items()]

    def taken(self) -> dict[str, dict[str, int]]:
        """The counts so far (``{"prefill tokens": {...}, "evictions": {...}}``)."""
        with self._lock:
            items = list(self.counts.items())
        out: dict[str, dict[str, int]] = {PREFILL: {}, EVICTIONS: {}}
        for (group, what), count in items:
            if count:
                out[group][what] = count
        return out

    def close(self) -> None:
        for unsubscribe in self._unsubscribe:
            unsubscribe()

    def _add(self, group: str, what: str, count: int) -> None:
        with self._lock:
            self.counts[group, what] += count

    def _added(self, e: RequestAdded) -> None:
        self.live[e.request_id] = _Admission(prompt=e.prompt_tokens)

    def _scheduled(self, e: RequestScheduled) -> None:
        if (a := self.live.get(e.request_id)) is not None:
            a.cached, a.chunks, a.first = e.cached_tokens, 0, True

    def _chunk(self, e: PrefillChunk) -> None:
        a = self.live.get(e.request_id)
        if a is not None and a.first:
            a.chunks += e.tokens
        else:  # a recovery's, or a request added before this ledger listened
            self._add(PREFILL, "recomputed", e.tokens)

    def _prefilled(self, rid: str) -> None:
        """The first admission's prefill ended: the request is covered."""
        a = self.live.get(rid)
        if a is not None and a.first:
            a.first = False
            self._add(PREFILL, "covered", 1)

    def _cut(self, rid: str) -> None:
        """The first admission ended before its prefill did: nothing of it is covered."""
        a = self.live.get(rid)
        if a is not None and a.first:
            a.first = False
            self._add(PREFILL, "uncovered queried", a.prompt)
            self._add(PREFILL, "uncovered hit", a.cached)
            self._add(PREFILL, "recomputed", a.chunks)

    def _ended(self, rid: str, *, prefilled: bool) -> None:
        if prefilled:
            self._prefilled(rid)
        else:
            self._cut(rid)
        self.live.pop(rid, None)

    def _released(self, e: SnapshotReleased) -> None:
        if e.reason in SNAPSHOT_EVICTED:
            self._add(EVICTIONS, "snapshot", 1)
