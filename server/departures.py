"""Requests whose client left: each must stop within a few engine steps.

A client that hangs up expects its request to stop costing the engine
anything. The completion handlers abort a request when they see the
disconnect, but a handler, the worker's abort lane or the engine's abort
path can each lose it, and then the request runs on to its token limit with
nobody reading: a leak of compute, invisible to every pool, since the request
ends and frees its pages in the end. This is the oracle for it, kept apart
from the abort path it judges:

    ClientWatch (clients.py) sees the HTTP disconnect ─► Departures.left(rid)
    the worker, after every step ─► check(step, live): a request still live
        ABANDON_STEPS steps after its client left is an ``abandoned`` finding
    /debug/probe ─► findings(): the ones found since the previous probe

Bounded: an entry lives until its request ends or is reported, and at most
``MAX_KEPT`` findings wait for a probe.
"""

from __future__ import annotations

import queue
from collections import deque
from collections.abc import Callable
from types import MappingProxyType

from kvwatch.contracts import Finding, FindingKind, finding

# The worker hands a disconnect to the engine at its next safe point (mid-step
# if one runs); a request still live this many steps later was never aborted.
ABANDON_STEPS = 16
MAX_KEPT = 32


class Departures:
    # found but not yet probed: at most MAX_KEPT (registry walks check it)
    __bounded__ = MappingProxyType({"_found": MAX_KEPT})

    def __init__(self) -> None:
        self._arrivals: queue.SimpleQueue[str] = queue.SimpleQueue()  # from the event loop
        self._left: dict[str, int | None] = {}  # request id -> step its client left at
        self._found: deque[Finding] = deque(maxlen=MAX_KEPT)

    def left(self, request_id: str) -> None:
        """From any thread: the client of ``request_id`` went away."""
        self._arrivals.put(request_id)

    def check(self, step: int, live: Callable[[str], bool]) -> None:
        """On the worker thread: note new departures at ``step``; a request still
        ``live`` ABANDON_STEPS steps after its client left becomes a finding."""
        while True:
            try:
                self._left.setdefault(self._arrivals.get_nowait(), step)
            except queue.Empty:
                break
        for rid, since in list(self._left.items()):
            if not live(rid):
                del self._left[rid]
            elif step - since >= ABANDON_STEPS:
                del self._left[rid]
                detail = (
                    f"request {rid} still runs {step - since} engine steps after its client "
                    f"left (at step {since}): nothing aborted it"
                )
                self._found.append(finding(FindingKind.ABANDONED, None, [], detail))

    def findings(self) -> tuple[Finding, ...]:
        """The requests found abandoned since the previous call."""
        out = tuple(self._found)
        self._found.clear()
        return out
