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
    page_ids: tuple[int, ...]  # the full.kv pages it gave back


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


class SlotPrepared(NamedTuple):
    holder_id: int
    slot: int
    boundary: int


class SlotConfirmed(NamedTuple):
    holder_id: int
    slot: int
    length: int
    stale_erased: int  # entries that still pointed at the reused slot


class SlotAborted(NamedTuple):
    holder_id: int
    slot: int
    reason: str  # "degenerate boundary", "no room", "aborted", "retracted", ...


class SlotRestored(NamedTuple):
    holder_id: int
    slot: int
    length: int


class SlotMissed(NamedTuple):
    """An entry matched the prompt but its slot could not be restored."""

    holder_id: int
    slot: int
    reason: str


class SlotEvicted(NamedTuple):
    slot: int
    length: int
    reason: str  # "pressure" or "flush"


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


# -- request lifecycle ------------------------------------------------------------------
class RequestAdded(NamedTuple):
    request_id: str
    prompt_tokens: int
    step: int
    session_id: str | None = None
    # Opaque (key, value) pairs the caller attached (a server's model name,
    # operation, prompt text on opt-in); the engine only passes them on.
    labels: tuple[tuple[str, str], ...] = ()


class RequestWaiting(NamedTuple):
    """Queued behind a running request that is computing the prefix it shares."""

    request_id: str
    step: int


class RequestScheduled(NamedTuple):
    """First admission: the request leaves the queue with this much served from cache."""

    request_id: str
    step: int
    hit_tokens: int  # prompt tokens found in the tree's history
    cached_tokens: int  # prompt tokens skipped: the depth of the restored snapshot
    holder_id: int = 0  # the cache holder: cache events name it, not the request


class PrefillChunk(NamedTuple):
    request_id: str
    start: int
    tokens: int
    step: int


class TokensGenerated(NamedTuple):
    request_id: str
    count: int
    first: bool  # the request's first output token is among them
    step: int


class SpecVerified(NamedTuple):
    request_id: str
    drafts: int
    accepted: int


class RequestRetracted(NamedTuple):
    request_id: str
    computed_tokens: int
    stage: str = ""  # "prefill", "decode" or "verify": what its in-flight work was


class RequestRecovered(NamedTuple):
    """Admitted again after a retraction or a pause; it recomputes past ``resume_len``."""

    request_id: str
    resume_len: int


class RequestPaused(NamedTuple):
    request_id: str


class RequestFinished(NamedTuple):
    request_id: str
    reason: str  # "stop" or "length"
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int


class RequestAborted(NamedTuple):
    request_id: str
    stage: str  # "queued", "prefill", "decode", "verify", "retracted" or "paused"


class RequestFailed(NamedTuple):
    request_id: str
    error: str


class BatchComputed(NamedTuple):
    """The forward of a step is done; its results are not applied yet."""

    step: int
    request_ids: tuple[str, ...]
    tokens: int


# -- sessions ---------------------------------------------------------------------------
class SessionOpened(NamedTuple):
    session_id: str


class SessionRolledBack(NamedTuple):
    session_id: str
    steps: int


class SessionClosed(NamedTuple):
    session_id: str
    reason: str  # "closed" (a client asked) or "idle timeout"
