"""EngineMetrics: pool gauges polled from ``EngineStats``, counters and latency
histograms fed by engine events.

Every instrument carries its ``names.HELP`` text as its description (the
``# HELP`` line); the histograms' bucket bounds come from the meter
provider's views (``buckets.py``), not from here.

Gauges read a stats snapshot taken at a step boundary (``StatsCache`` keeps
one scrape from asking the engine once per instrument). Counters and
histograms are listeners: they run on the engine thread as events fire and
stamp them with a monotonic clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from kvwatch.engine.events import (
    EventBus,
    NodeEvicted,
    PrefillChunk,
    RequestAborted,
    RequestAdded,
    RequestFailed,
    RequestFinished,
    RequestRetracted,
    RequestScheduled,
    SlotEvicted,
    SnapshotReleased,
    TokensGenerated,
)
from kvwatch.engine.probe import EngineStats
from kvwatch.instrumentation import names as n
from kvwatch.instrumentation.tally import Tally, attr_key


class StatsCache:
    """The latest ``EngineStats``, re-read when older than ``max_age`` seconds or
    once ``expire`` was called (a scrape starting: it must see what came before it)."""

    def __init__(self, source: Callable[[], EngineStats], max_age: float = 0.25) -> None:
        self.source, self.max_age = source, max_age
        self._lock = threading.Lock()
        self._value: EngineStats | None = None
        self._at = 0.0

    def get(self) -> EngineStats:
        with self._lock:
            now = time.monotonic()
            if self._value is None or now - self._at > self.max_age:
                self._value, self._at = self.source(), now
            return self._value

    def expire(self) -> None:
        """The next ``get`` reads the engine again, however recent the last read."""
        with self._lock:
            self._value = None


def _pool_pages(stats: EngineStats) -> Iterable[Observation]:
    for group, g in stats.groups.items():
        values = {
            "free": g.free,
            "used": g.capacity - g.free,
            "evictable": g.evictable,
            "pinned_request": g.by_owner.get("request", 0),
            "pinned_session": g.by_owner.get("session", 0),
            # the host tier: pinned for a retracted request's recovery, or cache
            "host": g.by_owner.get("host", 0) - g.by_owner.get("host_evictable", 0),
            "host_evictable": g.by_owner.get("host_evictable", 0),
        }
        for state in n.POOL_STATES:
            yield Observation(values[state], {n.GROUP: group, n.FAMILY: g.family, n.STATE: state})


class _Request:
    __slots__ = ("added", "attrs", "first", "key", "prompt")

    def __init__(self, added: float, prompt: int, labels: dict[str, str]) -> None:
        self.added, self.prompt = added, prompt
        # the request's metric attributes, worked out once: every token event uses them
        self.attrs = {k: v for k, v in labels.items() if k in (n.OPERATION, n.MODEL)}
        self.key = attr_key(self.attrs)
        self.first: float | None = None


class EngineMetrics:
    def __init__(
        self,
        meter: Meter,
        events: EventBus,
        stats: Callable[[], EngineStats],
        stats_max_age: float = 0.25,
    ) -> None:
        self.stats = StatsCache(stats, stats_max_age)
        self._requests: dict[str, _Request] = {}
        self._gauges(meter)
        # per-request and per-token counts: tallies, not synchronous counters (tally.py)
        self.queried = Tally(meter, n.PREFIX_QUERIED, "{token}", n.HELP[n.PREFIX_QUERIED])
        self.hit = Tally(meter, n.PREFIX_HIT, "{token}", n.HELP[n.PREFIX_HIT])
        self.generated = Tally(meter, n.TOKENS_GENERATED, "{token}", n.HELP[n.TOKENS_GENERATED])
        self.computed = Tally(meter, n.PREFILL_COMPUTED, "{token}", n.HELP[n.PREFILL_COMPUTED])
        self.retractions = meter.create_counter(
            n.RETRACTIONS, unit="{request}", description=n.HELP[n.RETRACTIONS]
        )
        self.aborts = meter.create_counter(n.ABORTS, unit="{request}", description=n.HELP[n.ABORTS])
        self.evictions = meter.create_counter(
            n.EVICTIONS, unit="{eviction}", description=n.HELP[n.EVICTIONS]
        )
        self.finished = meter.create_counter(
            n.REQUESTS_FINISHED, unit="{request}", description=n.HELP[n.REQUESTS_FINISHED]
        )
        self.ttft = meter.create_histogram(n.TTFT, unit="s", description=n.HELP[n.TTFT])
        self.tpot = meter.create_histogram(n.TPOT, unit="s", description=n.HELP[n.TPOT])
        self.duration = meter.create_histogram(
            n.REQUEST_DURATION, unit="s", description=n.HELP[n.REQUEST_DURATION]
        )
        # Series start at 0 so a rate reads 0, not "no data", before the first event.
        self.retractions.add(0)
        for stage in n.ABORT_STAGES:
            self.aborts.add(0, {n.STAGE: stage})
        for kind in n.EVICTION_KINDS:
            self.evictions.add(0, {n.KIND: kind})
        self._unsubscribe = [
            events.subscribe(RequestAdded, self._added),
            events.subscribe(RequestScheduled, self._scheduled),
            events.subscribe(TokensGenerated, self._tokens),
            events.subscribe(PrefillChunk, self._prefill_chunk),
            events.subscribe(RequestFinished, self._finished),
            events.subscribe(RequestAborted, self._aborted),
            events.subscribe(RequestFailed, self._failed),
            events.subscribe(RequestRetracted, lambda e: self.retractions.add(1)),
            events.subscribe(NodeEvicted, self._node_evicted),
            events.subscribe(SlotEvicted, self._slot_evicted),
            events.subscribe(SnapshotReleased, self._snapshot_released),
        ]

    def close(self) -> None:
        for unsubscribe in self._unsubscribe:
            unsubscribe()

    # -- gauges ---------------------------------------------------------------------------
    def _gauges(self, meter: Meter) -> None:
        def gauge(name: str, read: Callable[[EngineStats], Iterable[Observation]], unit: str):
            def callback(options: CallbackOptions) -> Iterable[Observation]:
                return list(read(self.stats.get()))

            meter.create_observable_gauge(name, [callback], unit=unit, description=n.HELP[name])

        def per_group(pick: Callable) -> Callable[[EngineStats], Iterable[Observation]]:
            return lambda s: (Observation(pick(g), {n.GROUP: k}) for k, g in s.groups.items())

        gauge(n.POOL_PAGES, _pool_pages, "{page}")
        gauge(
            n.POOL_CAPACITY,
            lambda s: (
                Observation(g.capacity, {n.GROUP: name, n.FAMILY: g.family})
                for name, g in s.groups.items()
            ),
            "{page}",
        )
        gauge(n.ROOT_REFS, lambda s: [Observation(s.root_refs.actual)], "{ref}")
        gauge(n.ROOT_REFS_EXPECTED, lambda s: [Observation(s.root_refs.expected)], "{ref}")
        gauge(n.TREE_NODES, lambda s: [Observation(s.tree.nodes)], "{node}")
        gauge(
            n.TREE_SNAPSHOTS,
            lambda s: (Observation(v, {n.GROUP: g}) for g, v in s.tree.snapshots.items()),
            "{snapshot}",
        )
        gauge(
            n.TREE_INTERIOR_SNAPSHOTS,
            lambda s: (Observation(v, {n.GROUP: g}) for g, v in s.tree.interior_snapshots.items()),
            "{snapshot}",
        )
        gauge(n.SESSION_PAGES, per_group(lambda g: g.by_owner.get("session", 0)), "{page}")
        gauge(n.SESSIONS_LIVE, lambda s: [Observation(s.live_sessions)], "{session}")
        gauge(n.RECORD_BYTES, lambda s: [Observation(s.record_bytes)], "By")
        gauge(
            n.REQUESTS_LIVE,
            lambda s: (Observation(v, {n.STATE: k}) for k, v in s.queue._asdict().items()),
            "{request}",
        )
        gauge(n.SLOTS_FILLED, lambda s: [Observation(s.slots.filled)] if s.slots else [], "{slot}")
        gauge(
            n.SLOT_ENTRIES, lambda s: [Observation(s.slots.entries)] if s.slots else [], "{entry}"
        )

    # -- listeners ------------------------------------------------------------------------
    def _attrs(self, rid: str) -> dict[str, str]:
        req = self._requests.get(rid)
        return {} if req is None else req.attrs

    def _added(self, e: RequestAdded) -> None:
        self._requests[e.request_id] = _Request(time.monotonic(), e.prompt_tokens, dict(e.labels))

    def _scheduled(self, e: RequestScheduled) -> None:
        req = self._requests.get(e.request_id)
        if req is not None:
            self.queried.add(req.prompt, req.key)
            self.hit.add(e.cached_tokens, req.key)

    def _prefill_chunk(self, e: PrefillChunk) -> None:
        self.computed.add(e.tokens)

    def _tokens(self, e: TokensGenerated) -> None:
        req = self._requests.get(e.request_id)
        if req is None:
            self.generated.add(e.count)
            return
        self.generated.add(e.count, req.key)
        if e.first and req.first is None:
            req.first = time.monotonic()
            self.ttft.record(req.first - req.added, req.attrs)

    def _finished(self, e: RequestFinished) -> None:
        attrs = self._attrs(e.request_id)
        req = self._requests.pop(e.request_id, None)
        self.finished.add(1, {**attrs, n.REASON: e.reason})
        if req is None:
            return
        now = time.monotonic()
        self.duration.record(now - req.added, attrs)
        if req.first is not None and e.output_tokens > 1:
            self.tpot.record((now - req.first) / (e.output_tokens - 1), attrs)

    def _aborted(self, e: RequestAborted) -> None:
        self._requests.pop(e.request_id, None)
        self.aborts.add(1, {n.STAGE: e.stage})
        self.finished.add(1, {n.REASON: "abort"})

    def _failed(self, e: RequestFailed) -> None:
        attrs = self._attrs(e.request_id)
        self._requests.pop(e.request_id, None)
        self.finished.add(1, {**attrs, n.REASON: "error"})

    def _node_evicted(self, e: NodeEvicted) -> None:
        self.evictions.add(1, {n.KIND: "node"})

    def _slot_evicted(self, e: SlotEvicted) -> None:
        self.evictions.add(1, {n.KIND: "slot"})

    def _snapshot_released(self, e: SnapshotReleased) -> None:
        if e.reason in ("pruned", "evicted", "flushed"):
            self.evictions.add(1, {n.KIND: "snapshot"})
