"""Typed engine events and the bus that delivers them.

The engine core publishes; instrumentation subscribes. Events are immutable
NamedTuples so a subscriber can keep them without copying, and emitting with
no subscriber costs one dict lookup.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any, NamedTuple


class NodeEvicted(NamedTuple):
    node_id: int
    depth: int
    pages: int


class SnapshotTaken(NamedTuple):
    node_id: int
    depth: int
    kind: str  # "interval", "terminal" or "fill"


class SnapshotReleased(NamedTuple):
    node_id: int
    depth: int
    reason: str  # "superseded", "pruned" or "evicted"


class SnapshotMoved(NamedTuple):
    node_id: int
    depth: int
    tier: str  # the tier it moved to


class SnapshotSkipped(NamedTuple):
    holder_id: int
    boundary: int
    reason: str


class EventBus:
    def __init__(self) -> None:
        self._subscribers: dict[type, list[Callable[[Any], None]]] = defaultdict(list)

    def subscribe(self, event_type: type, handler: Callable[[Any], None]) -> Callable[[], None]:
        """Call ``handler(event)`` for every ``event_type`` event; returns an unsubscribe."""
        self._subscribers[event_type].append(handler)
        return lambda: self._subscribers[event_type].remove(handler)

    def emit(self, event: NamedTuple) -> None:
        for handler in self._subscribers.get(type(event), ()):
            handler(event)
