"""Typed engine events and the bus that delivers them.

The engine core publishes; instrumentation subscribes. Events are immutable
NamedTuples so a subscriber can keep them without copying. A publisher whose
event is costly to build (a tuple of page ids per evicted node) asks
``EventBus.listens`` first and builds nothing for a type nobody subscribes to:
such an event would be delivered to nobody, so skipping it changes nothing a
listener can see.

Events are telemetry, never control: a handler that raises is caught, logged
once per (event type, handler) and counted (``EventBus.failures``), and the
engine goes on exactly as if nobody listened. The engine's probe reports the
count as a ``listener`` finding, so a broken listener is seen, not silent.
Inside ``EventBus.deferred()`` events queue up and are delivered in order
when the outermost block exits, so a listener never sees a half-done change.
"""

from __future__ import annotations

import contextlib
import logging
import types
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

log = logging.getLogger(__name__)


class NodeEvicted(NamedTuple):
    node_id: int
    depth: int
    page_ids: tuple[int, ...]  # the full.kv pages it gave back
    path_key: int = 0  # its path's first page (``paths.path_key``), as RequestAdded's


class PagesStored(NamedTuple):
    """A node joined the radix tree: its pages, each under its block key."""

    node_id: int
    keys: tuple[int, ...]  # ``paths.block_keys``: one per page, in order
    page_ids: tuple[int, ...]


class PagesRemoved(NamedTuple):
    """A node left the radix tree (evicted or flushed): its pages' keys are gone."""

    node_id: int
    keys: tuple[int, ...]
    page_ids: tuple[int, ...]


class RefsMoved(NamedTuple):
    """``node.refs`` of each node changed by ``delta``, for ``holder`` ("" for none)."""

    holder: str
    node_ids: tuple[int, ...]
    delta: int


class NodeSplit(NamedTuple):
    """A split made ``upper_id`` the top of ``node_id``, with ``node_id``'s refs."""

    node_id: int
    upper_id: int


class SnapshotTaken(NamedTuple):
    node_id: int
    depth: int
    kind: str  # "interval", "terminal" or "fill"


class SnapshotReleased(NamedTuple):
    node_id: int
    depth: int
    reason: str  # "superseded", "pruned" (pressure), "evicted" (with its node) or "flushed"


class SnapshotMoved(NamedTuple):
    node_id: int
    depth: int
    tier: str  # the tier it moved to


class SnapshotSkipped(NamedTuple):
    holder_id: int
    boundary: int
    reason: str


class FailpointFired(NamedTuple):
    """A failpoint failed an allocation on purpose (``CacheConfig.failpoints``)."""

    site: str  # a ``failpoints.Site`` value
    hit: int  # the site's hit that failed, from 1
    group: str  # the group it failed in


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
    """Delivers each event to its type's handlers, in the order they subscribed.

    Invariants: the engine's behaviour never depends on its listeners (a
    raising handler is isolated and counted, the other handlers still get the
    event); a handler that subscribes or unsubscribes during a delivery does
    not change that delivery (it iterates over a copy); within ``deferred()``
    nothing is delivered until the outermost block exits, and then every
    queued event is, in emit order, whether or not the block raised.
    """

    # one count per event type, one entry per (event type, handler) that ever
    # raised: bounded by the code, not by the traffic (registry walks check it)
    __bounded__ = MappingProxyType({"_failures": 64, "_logged": 256})

    def __init__(self) -> None:
        self._subscribers: dict[type, list[Callable[[Any], None]]] = defaultdict(list)
        self._failures: Counter[str] = Counter()
        self._logged: set[tuple[str, str]] = set()
        self._depth = 0  # open deferred() blocks
        self._queue: deque[NamedTuple] = deque()  # emitted inside them, not delivered yet

    def subscribe(self, event_type: type, handler: Callable[[Any], None]) -> Callable[[], None]:
        """Call ``handler(event)`` for every ``event_type`` event; returns an unsubscribe."""
        self._subscribers[event_type].append(handler)
        return lambda: self._subscribers[event_type].remove(handler)

    def listens(self, event_type: type) -> bool:
        """Whether ``event_type`` has a subscriber now.

        A publisher may skip building an event of a type with none. Such an
        event is delivered to nobody either way, except to a handler that
        subscribes between its emit and its delivery (inside ``deferred()``,
        from a handler of an earlier event): a handler sees the events of its
        type emitted after it subscribed.
        """
        return bool(self._subscribers.get(event_type))

    def emit(self, event: NamedTuple) -> None:
        if self._depth:
            self._queue.append(event)
        else:
            self._deliver(event)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Hold every event emitted in the block until the outermost block exits.

        Nested blocks only count their depth; the outermost exit delivers the
        queue in emit order (events emitted by handlers meanwhile join its
        end), then lets the block's exception, if any, propagate.
        """
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if not self._depth:
                self._flush()

    def _flush(self) -> None:
        self._depth += 1  # handlers' own emits queue behind the ones still pending
        try:
            while self._queue:
                self._deliver(self._queue.popleft())
        finally:
            self._depth -= 1

    def _deliver(self, event: NamedTuple) -> None:
        for handler in tuple(self._subscribers.get(type(event), ())):
            try:
                handler(event)
            except Exception:  # telemetry must not change what the engine does
                self._failed(type(event).__name__, handler)

    def _failed(self, event_name: str, handler: Callable[[Any], None]) -> None:
        self._failures[event_name] += 1
        name = getattr(handler, "__qualname__", None) or repr(handler)
        key = (event_name, f"{getattr(handler, '__module__', '')}.{name}")
        if key not in self._logged:
            self._logged.add(key)
            log.exception("an event handler raised: %s on %s (counted; logged once)", *key[::-1])

    @property
    def failures(self) -> Mapping[str, int]:
        """Handler failures so far by event type name: a read-only copy."""
        return types.MappingProxyType(dict(self._failures))

    @property
    def failure_count(self) -> int:
        return sum(self._failures.values())


# -- request lifecycle ------------------------------------------------------------------
class RequestAdded(NamedTuple):
    request_id: str
    prompt_tokens: int
    step: int
    session_id: str | None = None
    # Opaque (key, value) pairs the caller attached (a server's model name,
    # operation, prompt text on opt-in); the engine only passes them on.
    labels: tuple[tuple[str, str], ...] = ()
    # ``paths.path_key`` of the prompt (its first full page; 0 without one): requests
    # with equal keys are on the same path. ``prompt_key``: a digest of the prompt.
    path_key: int = 0
    prompt_key: int = 0


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
    # Where the prompt first differs from what the cache holds on its path, to the
    # token (hit_tokens is page-aligned; this goes on into the page that differs);
    # a session turn's resume point; at most the prompt's length.
    branch_tokens: int = 0


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


class SessionBusy(NamedTuple):
    """A close, rollback or idle close refused (``session_busy``): a turn is in flight."""

    session_id: str
    action: str  # "close", "rollback" or "idle timeout"
    request_id: str  # the turn in flight
