"""The event bus: a raising handler is isolated, counted and logged once; deferred
blocks hold events until the outermost one exits, then deliver them in order."""

from __future__ import annotations

import logging

import pytest

from kvwatch.engine.events import EventBus, RequestPaused, RequestWaiting

LOGGER = "kvwatch.engine.events"


def broken(event) -> None:
    raise RuntimeError(f"listener bug on {event.request_id}")


def test_a_raising_handler_is_counted_logged_once_and_the_others_still_run(caplog):
    bus = EventBus()
    seen: list[str] = []
    bus.subscribe(RequestPaused, broken)
    bus.subscribe(RequestPaused, lambda e: seen.append(e.request_id))
    bus.subscribe(RequestWaiting, broken)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        for rid in ("a", "b", "c"):
            bus.emit(RequestPaused(rid))
        bus.emit(RequestWaiting("d", 0))
    assert seen == ["a", "b", "c"]
    assert bus.failures == {"RequestPaused": 3, "RequestWaiting": 1}
    assert bus.failure_count == 4
    # once per (event type, handler), each with the handler's traceback
    records = [r for r in caplog.records if r.name == LOGGER]
    assert len(records) == 2, [r.getMessage() for r in records]
    assert all(r.exc_info and "listener bug on" in str(r.exc_info[1]) for r in records)
    assert "RequestPaused" in records[0].getMessage() and "broken" in records[0].getMessage()


def test_failures_is_a_snapshot():
    bus = EventBus()
    bus.subscribe(RequestPaused, broken)
    bus.emit(RequestPaused("a"))
    snapshot = bus.failures
    with pytest.raises(TypeError):
        snapshot["RequestPaused"] = 0  # read-only
    bus.emit(RequestPaused("b"))
    assert snapshot == {"RequestPaused": 1} and bus.failures == {"RequestPaused": 2}


def test_a_handler_that_unsubscribes_itself_does_not_skip_the_next_one():
    """Delivery iterates over a copy: removing from the live list mid-delivery
    would shift the next handler into the removed one's place and skip it."""
    bus = EventBus()
    seen: list[str] = []

    def once(event) -> None:
        seen.append("once")
        unsubscribe()

    unsubscribe = bus.subscribe(RequestPaused, once)
    bus.subscribe(RequestPaused, lambda e: seen.append("always"))
    bus.emit(RequestPaused("a"))
    bus.emit(RequestPaused("b"))
    assert seen == ["once", "always", "always"]


def test_nested_deferred_blocks_deliver_once_at_the_outermost_exit_in_order():
    bus = EventBus()
    seen: list[str] = []
    bus.subscribe(RequestPaused, lambda e: seen.append(e.request_id))
    with bus.deferred():
        bus.emit(RequestPaused("a"))
        with bus.deferred():
            bus.emit(RequestPaused("b"))
        assert seen == []  # the inner exit delivers nothing
        bus.emit(RequestPaused("c"))
        assert seen == []
    assert seen == ["a", "b", "c"]
    bus.emit(RequestPaused("d"))  # outside any block: at once
    assert seen == ["a", "b", "c", "d"]


def test_a_deferred_block_that_raises_still_delivers_what_it_queued():
    bus = EventBus()
    seen: list[str] = []
    bus.subscribe(RequestPaused, lambda e: seen.append(e.request_id))
    with pytest.raises(KeyError), bus.deferred():
        bus.emit(RequestPaused("a"))
        with bus.deferred():
            bus.emit(RequestPaused("b"))
            raise KeyError("mutation failed half-way")
    assert seen == ["a", "b"]
    with bus.deferred():  # and the bus is back at depth 0: nothing left queued
        pass
    assert seen == ["a", "b"]


def test_events_emitted_by_handlers_during_delivery_join_the_end_of_the_queue():
    bus = EventBus()
    seen: list[str] = []

    def chain(event: RequestPaused) -> None:
        seen.append(event.request_id)
        if event.request_id == "a":
            bus.emit(RequestPaused("a2"))

    bus.subscribe(RequestPaused, chain)
    bus.subscribe(RequestPaused, broken)  # isolated inside deferred delivery too
    with bus.deferred():
        bus.emit(RequestPaused("a"))
        bus.emit(RequestPaused("b"))
    assert seen == ["a", "b", "a2"]
    assert bus.failures == {"RequestPaused": 3}
