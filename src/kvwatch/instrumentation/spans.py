"""RequestSpans: one span per request, built from engine events.

    "{operation} {model}"                 RequestAdded .. finished/aborted/failed
      ├─ queue                            added .. first admission
      ├─ prefill_chunk  (one per chunk)   previous mark .. chunk applied
      └─ decode                           first token .. end
    span events: retracted, recovered, paused, spec verify, slot actions

Cache events name holders, not requests; ``RequestScheduled`` links the two.
Listeners run on the engine thread, so a request's spans are only ever
touched from there.
"""

from __future__ import annotations

import time

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from kvwatch.engine import events as ev
from kvwatch.instrumentation import names as n

SLOT_EVENTS = (ev.SlotPrepared, ev.SlotConfirmed, ev.SlotAborted, ev.SlotRestored, ev.SlotMissed)


PENDING_HOLDERS = 1024  # holders whose cache events wait for their request's admission


class _Live:
    __slots__ = ("child", "decode", "holder", "mark", "queued", "root")

    def __init__(self, root: Span) -> None:
        self.root = root
        self.child: Span | None = None
        self.decode: Span | None = None
        self.holder = 0
        self.queued = True
        self.mark = time.time_ns()


class RequestSpans:
    def __init__(self, tracer: Tracer, events: ev.EventBus) -> None:
        self.tracer = tracer
        self.live: dict[str, _Live] = {}
        self.by_holder: dict[int, str] = {}
        # Cache events fire inside admission, before RequestScheduled names the
        # holder: they wait here while some request is queued, and no longer.
        self.early: dict[int, list[tuple[str, dict]]] = {}
        self.queued = 0  # live requests not yet scheduled
        subs = [
            (ev.RequestAdded, self._added),
            (ev.RequestScheduled, self._scheduled),
            (ev.PrefillChunk, self._chunk),
            (ev.TokensGenerated, self._tokens),
            (ev.RequestFinished, self._finished),
            (ev.RequestAborted, self._aborted),
            (ev.RequestFailed, self._failed),
            (ev.RequestRetracted, self._event(n.EVENT_RETRACTED, "computed_tokens")),
            (ev.RequestRecovered, self._event(n.EVENT_RECOVERED, "resume_len")),
            (ev.RequestPaused, self._event(n.EVENT_PAUSED)),
            (ev.SpecVerified, self._event(n.EVENT_SPEC, "drafts", "accepted")),
            (ev.SnapshotSkipped, self._holder_event(n.EVENT_SNAPSHOT_SKIPPED)),
            *((kind, self._holder_event(n.EVENT_SLOT)) for kind in SLOT_EVENTS),
        ]
        self._unsubscribe = [events.subscribe(kind, fn) for kind, fn in subs]

    def close(self) -> None:
        for unsubscribe in self._unsubscribe:
            unsubscribe()

    def _child(self, live: _Live, name: str, start: int) -> Span:
        ctx = trace.set_span_in_context(live.root)
        return self.tracer.start_span(name, context=ctx, start_time=start)

    # -- lifecycle ----------------------------------------------------------------------
    def _added(self, e: ev.RequestAdded) -> None:
        labels = dict(e.labels)
        name = " ".join(x for x in (labels.get(n.OPERATION), labels.get(n.MODEL)) if x)
        attrs = {n.INPUT_TOKENS: e.prompt_tokens, n.RESPONSE_ID: e.request_id, **labels}
        if e.session_id is not None:
            attrs[n.CONVERSATION] = e.session_id
        root = self.tracer.start_span(name or "request", attributes=attrs)
        live = _Live(root)
        live.child = self._child(live, n.SPAN_QUEUE, live.mark)
        self.live[e.request_id] = live
        self.queued += 1

    def _scheduled(self, e: ev.RequestScheduled) -> None:
        live = self.live.get(e.request_id)
        if live is None:
            return
        live.child.end()
        live.mark = time.time_ns()
        live.holder = e.holder_id
        self.by_holder[e.holder_id] = e.request_id
        for name, attrs in self.early.pop(e.holder_id, ()):
            live.root.add_event(name, attrs)
        self._dequeue(live)
        live.root.set_attribute(n.CACHE_READ_TOKENS, e.cached_tokens)
        live.root.set_attribute(n.HIT_TOKENS, e.hit_tokens)

    def _chunk(self, e: ev.PrefillChunk) -> None:
        live = self.live.get(e.request_id)
        if live is None:
            return
        now = time.time_ns()
        span = self._child(live, n.SPAN_PREFILL, live.mark)
        span.set_attribute("kvwatch.chunk.start", e.start)
        span.set_attribute("kvwatch.chunk.tokens", e.tokens)
        span.end(now)
        live.mark = now

    def _tokens(self, e: ev.TokensGenerated) -> None:
        live = self.live.get(e.request_id)
        if live is not None and e.first and live.decode is None:
            live.decode = self._child(live, n.SPAN_DECODE, time.time_ns())

    def _end(self, request_id: str, attrs: dict, error: str | None = None) -> None:
        live = self.live.pop(request_id, None)
        if live is None:
            return
        self.by_holder.pop(live.holder, None)
        if live.decode is not None:
            live.decode.end()
        if live.queued:
            live.child.end()
            self._dequeue(live)
        live.root.set_attributes(attrs)
        if error is not None:
            live.root.set_status(Status(StatusCode.ERROR, error))
        live.root.end()

    def _dequeue(self, live: _Live) -> None:
        """A request left the queue. With none queued, no admission is under way,
        so cache events still waiting belong to holders no request will name: a
        failed admission's, or a session slot's between its turns."""
        live.queued = False
        self.queued -= 1
        if not self.queued:
            self.early.clear()

    def _finished(self, e: ev.RequestFinished) -> None:
        self._end(e.request_id, {n.OUTPUT_TOKENS: e.output_tokens, n.FINISH_REASONS: [e.reason]})

    def _aborted(self, e: ev.RequestAborted) -> None:
        self._end(e.request_id, {n.FINISH_REASONS: ["abort"], "kvwatch.abort.stage": e.stage})

    def _failed(self, e: ev.RequestFailed) -> None:
        attrs = {n.FINISH_REASONS: ["error"], n.ERROR_TYPE: "request_failed"}
        self._end(e.request_id, attrs, e.error)

    # -- span events ----------------------------------------------------------------------
    def _event(self, name: str, *fields: str):
        def handler(e) -> None:
            live = self.live.get(e.request_id)
            if live is not None:
                live.root.add_event(name, {f: getattr(e, f) for f in fields})

        return handler

    def _holder_event(self, name: str):
        def handler(e) -> None:
            attrs = {k: v for k, v in e._asdict().items() if k != "holder_id"}
            attrs = {"action": type(e).__name__, **attrs}
            rid = self.by_holder.get(e.holder_id)
            if rid is not None and (live := self.live.get(rid)) is not None:
                live.root.add_event(name, attrs)
            elif self.queued and (e.holder_id in self.early or len(self.early) < PENDING_HOLDERS):
                self.early.setdefault(e.holder_id, []).append((name, attrs))

        return handler
