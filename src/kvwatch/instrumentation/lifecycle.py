"""LifecycleCounter: counts every lifecycle transition the engine takes, from its events.

It only listens (the engine never knows it is there). The machines it counts
against are ``coverage.py``'s; per request and per session it keeps the
current state while they live and drops it when they end.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from types import MappingProxyType

from kvwatch.engine.events import (
    EventBus,
    RequestAborted,
    RequestAdded,
    RequestFailed,
    RequestFinished,
    RequestPaused,
    RequestRecovered,
    RequestRetracted,
    RequestScheduled,
    RequestWaiting,
    SessionClosed,
    SessionOpened,
    SessionRolledBack,
    SlotAborted,
    SlotConfirmed,
    SlotEvicted,
    SlotMissed,
    SlotPrepared,
    SlotRestored,
    SnapshotMoved,
    SnapshotReleased,
    SpecVerified,
    TokensGenerated,
)
from kvwatch.instrumentation.coverage import MACHINES, NEW

_STAGES = {"verify": "verifying"}  # an abort or retraction mid-verify says so


class LifecycleCounter:
    """Counts transitions from engine events. One writer (the engine thread);
    ``taken`` copies under a lock. Per-request and per-session state is dropped
    when they end, so the counter holds only what is live."""

    # one count per transition the machines list (and a few unlisted ones), one state
    # per snapshot slot (registry walks check both bounds)
    __bounded__ = MappingProxyType(
        {
            "counts": sum(len(m.transitions) + len(m.also) for m in MACHINES.values()) + 32,
            "slots": 64,
        }
    )

    def __init__(self, events: EventBus) -> None:
        # every listed transition has its entry from the start, so the table never
        # grows while a load runs (a first-time transition is no new allocation)
        self.counts: Counter[tuple[str, str]] = Counter(
            {(name, edge): 0 for name, m in MACHINES.items() for edge in m.transitions + m.also}
        )
        self.requests: dict[str, str] = {}
        self.sessions: dict[str, str] = {}
        self.turns: dict[str, str] = {}  # request id -> its session, while the turn runs
        self.slots: dict[int, str] = {}
        self.hosted: set[int] = set()  # nodes whose state snapshot is on the host tier
        self._lock = threading.Lock()
        handlers: dict[type, Callable] = {
            RequestAdded: self._added,
            RequestWaiting: lambda e: self._request(e.request_id, "waiting"),
            RequestScheduled: lambda e: self._request(e.request_id, "prefilling"),
            TokensGenerated: self._tokens,
            SpecVerified: lambda e: self._request(e.request_id, "verifying"),
            RequestRetracted: lambda e: self._request(e.request_id, "retracted", e.stage),
            RequestPaused: lambda e: self._request(e.request_id, "paused"),
            RequestRecovered: lambda e: self._request(e.request_id, "recovering"),
            RequestFinished: lambda e: self._ended(e.request_id, "finished", "parked"),
            RequestAborted: lambda e: self._ended(e.request_id, "aborted", "cut", e.stage),
            RequestFailed: lambda e: self._ended(e.request_id, "failed", "cut"),
            SessionOpened: lambda e: self._session(e.session_id, "open"),
            SessionRolledBack: lambda e: self._session(e.session_id, "rolled back"),
            SessionClosed: self._closed,
            SlotPrepared: lambda e: self._slot(e.slot, "prepared"),
            SlotConfirmed: lambda e: self._slot(e.slot, "filled", start="prepared"),
            SlotAborted: lambda e: self._slot(e.slot, "aborted", start="prepared"),
            SlotRestored: lambda e: self._slot(e.slot, "restored"),
            SlotMissed: lambda e: self._slot(e.slot, "missed"),
            SlotEvicted: lambda e: self._slot(e.slot, f"evicted ({e.reason})"),
            SnapshotMoved: self._moved,
            SnapshotReleased: self._released,
        }
        self._unsubscribe = [events.subscribe(t, h) for t, h in handlers.items()]

    def taken(self) -> dict[str, dict[str, int]]:
        """Transitions taken so far, per machine (``{"request": {"new -> queued": 5}}``)."""
        with self._lock:
            items = list(self.counts.items())
        out: dict[str, dict[str, int]] = {name: {} for name in MACHINES}
        for (machine, edge), n in sorted(items):
            if n:
                out[machine][edge] = n
        return out

    def close(self) -> None:
        for unsubscribe in self._unsubscribe:
            unsubscribe()

    # -- machines -------------------------------------------------------------------------
    def _count(self, machine: str, before: str, after: str) -> None:
        if before != after:
            with self._lock:
                self.counts[machine, f"{before} -> {after}"] += 1

    def _request(self, rid: str, state: str, stage: str = "") -> None:
        before = self.requests.get(rid)
        if before is None:
            return  # added before this counter listened
        self._count("request", _STAGES.get(stage, before), state)
        self.requests[rid] = state

    def _added(self, e: RequestAdded) -> None:
        self.requests[e.request_id] = NEW
        self._request(e.request_id, "queued")
        if e.session_id is not None:
            self.turns[e.request_id] = e.session_id
            self._session(e.session_id, "running")

    def _tokens(self, e: TokensGenerated) -> None:
        if self.requests.get(e.request_id) in ("prefilling", "recovering", "verifying"):
            self._request(e.request_id, "decoding")

    def _ended(self, rid: str, state: str, session_state: str, stage: str = "") -> None:
        self._request(rid, state, stage)
        self.requests.pop(rid, None)
        if (sid := self.turns.pop(rid, None)) is not None:
            self._session(sid, session_state)

    def _session(self, sid: str, state: str) -> None:
        self._count("session", self.sessions.get(sid, NEW), state)
        self.sessions[sid] = state

    def _closed(self, e: SessionClosed) -> None:
        self._session(e.session_id, "timed out" if e.reason == "idle timeout" else "closed")
        self.sessions.pop(e.session_id, None)

    def _moved(self, e: SnapshotMoved) -> None:
        """A snapshot moved between the tiers (``host`` or ``device``)."""
        if e.tier == "host":
            self.hosted.add(e.node_id)
            self._count("host snapshot", "device", "host")
        elif e.node_id in self.hosted:
            self.hosted.discard(e.node_id)
            self._count("host snapshot", "host", "device")

    def _released(self, e: SnapshotReleased) -> None:
        """A snapshot let go; counted when it was on the host tier."""
        if e.node_id in self.hosted:
            self.hosted.discard(e.node_id)
            self._count("host snapshot", "host", e.reason)

    def _slot(self, slot: int, what: str, *, start: str | None = None) -> None:
        """A slot's content is empty or filled; a capture into it is prepared, then
        fills it or is aborted. ``start``: the transition starts there, not at
        the content (the capture's own steps)."""
        self._count("slot", start or self.slots.get(slot, "empty"), what)
        if what == "filled" or what.startswith("evicted"):
            self.slots[slot] = "filled" if what == "filled" else "empty"
