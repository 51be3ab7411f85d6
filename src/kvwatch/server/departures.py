"""Requests whose client left, or that the server aborted: each must stop.

A client that hangs up expects its request to stop costing the engine
anything. The completion handlers abort a request when they see the
disconnect, but a handler, the worker's abort lane or the engine's abort
path can each lose it, and then the request runs on to its token limit with
nobody reading: a leak of compute, invisible to every pool, since the request
ends and frees its pages in the end. This is the oracle for it, kept apart
from the abort path it judges:

    ClientWatch (clients.py) sees the HTTP disconnect ─► Departures.left(rid)
    the worker, after every step ─► check(step, live): a request still live
        ABANDON_STEPS steps and ABANDON_S seconds after its client left is an
        ``abandoned`` finding
    the worker, as a scripted abort comes due ─► ordered(rid, step): no event
        loop stands between the order and the engine, so a request still live
        ORDERED_STEPS steps later is an ``abandoned`` finding too
    /debug/probe ─► findings(): the ones found since the previous probe

A handler notices a disconnect within ``DISCONNECT_POLL_S`` (0.2 s) and the
worker hands it to the engine at the next safe point; on a fast engine that
is dozens of steps, on a slow one a step or two. So a request counts as
abandoned only once both margins are far behind it: many steps (a slow
machine's event loop cannot make that) and some seconds (a fast engine
cannot). A request that runs to its end unaborted is found when it outlives
both; the load's cut streams ask for long outputs so that one would.

An abort the worker orders itself (a test control's ``abort_in``: aborted once
queued, waiting, verifying, retracted, paused or recovering) reaches the
engine at once, at its safe point inside the step or between steps; the
engine applies it by the end of the next step at the latest. A request still
live after that lost its abort on the way (the worker's lane, the engine's
deferral), whatever the machine's speed.

Bounded: an entry lives until its request ends or is reported, and at most
``MAX_KEPT`` findings wait for a probe.
"""

from __future__ import annotations

import queue
import time
from collections import deque
from collections.abc import Callable
from types import MappingProxyType
from typing import NamedTuple

from kvwatch.contracts import Finding, FindingKind, finding

ABANDON_STEPS = 32
ABANDON_S = 3.0
ORDERED_STEPS = 2  # the step the order was given in, and the next
MAX_KEPT = 32


CLIENT_LEFT = "its client left"
SERVER_ABORTED = "the server aborted it"


class Since(NamedTuple):
    """Since when a request should have stopped, and how long it may still run."""

    step: int
    at: float  # time.monotonic()
    steps: int
    seconds: float


class Departures:
    # found but not yet probed: at most MAX_KEPT (registry walks check it)
    __bounded__ = MappingProxyType({"_found": MAX_KEPT})

    def __init__(self) -> None:
        # (request id, when its client left) from the event loop
        self._arrivals: queue.SimpleQueue[tuple[str, float]] = queue.SimpleQueue()
        # (request id, CLIENT_LEFT or SERVER_ABORTED) -> since when it should stop
        self._watched: dict[tuple[str, str], Since] = {}
        self._found: deque[Finding] = deque(maxlen=MAX_KEPT)

    def left(self, request_id: str) -> None:
        """From any thread: the client of ``request_id`` went away."""
        self._arrivals.put((request_id, time.monotonic()))

    def ordered(self, request_id: str, step: int) -> None:
        """On the worker thread: the server itself ordered ``request_id`` aborted at
        ``step``."""
        since = Since(step=step, at=time.monotonic(), steps=ORDERED_STEPS, seconds=0.0)
        self._watched.setdefault((request_id, SERVER_ABORTED), since)

    def check(self, step: int, live: Callable[[str], bool]) -> None:
        """On the worker thread: note new departures at ``step``; a request still
        ``live`` ABANDON_STEPS steps and ABANDON_S seconds after its client left, or
        ORDERED_STEPS steps after the server aborted it, becomes a finding."""
        while True:
            try:
                rid, at = self._arrivals.get_nowait()
            except queue.Empty:
                break
            since = Since(step=step, at=at, steps=ABANDON_STEPS, seconds=ABANDON_S)
            self._watched.setdefault((rid, CLIENT_LEFT), since)
        now = time.monotonic()
        for (rid, cause), since in list(self._watched.items()):
            if not live(rid):
                del self._watched[rid, cause]
            elif step - since.step >= since.steps and now - since.at >= since.seconds:
                del self._watched[rid, cause]
                detail = (
                    f"request {rid} still runs {step - since.step} engine steps and "
                    f"{now - since.at:.1f} s after {cause} (at step {since.step}): "
                    "its abort never reached the engine"
                )
                self._found.append(finding(FindingKind.ABANDONED, None, [], detail))

    def findings(self) -> tuple[Finding, ...]:
        """The requests found abandoned since the previous call."""
        out = tuple(self._found)
        self._found.clear()
        return out
