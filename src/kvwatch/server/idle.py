"""Idle sessions: when each HTTP session was last used, and the task that closes stale ones.

Invariant: with a timeout of T seconds, a session is closed only once it has
gone unused for at least T seconds, checked on the engine thread at the
moment of closing, and none of its turns is in flight. A use is any session
call (open, get, rollback, trajectory) and the start and the end of each of
its turns, which the clock hears from the engine's own events. Closing is
exactly ``DELETE /v1/sessions/{id}``: its tokens go into the tree and its
cache slot is released. Without a timeout (the default) the task does not
run and sessions live until a client closes them.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from types import MappingProxyType

from kvwatch.engine.engine import Engine
from kvwatch.engine.errors import SessionError
from kvwatch.engine.events import (
    EventBus,
    RequestAborted,
    RequestAdded,
    RequestFailed,
    RequestFinished,
)
from kvwatch.server.worker import EngineWorker

MAX_CHECK_PERIOD_S = 1.0
SWEEPS_KEPT = 4  # the latest finished sweeps, for the oracle's count (``overdue.SWEEPS``)

log = logging.getLogger(__name__)


class SessionClock:
    """The last use of each open session, in monotonic seconds.

    Thread-safe: handlers touch it on the event loop, the engine thread when
    a turn starts or ends. Ids that were never opened are not kept.
    """

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self.now = now
        # told of every use too: the idle-timeout oracle (``overdue.py``), with --enable-probe
        self.observer: Callable[[str], None] | None = None
        self._last: dict[str, float] = {}
        self._turns: dict[str, str] = {}  # request id -> session id, while the turn runs
        self._lock = threading.Lock()

    def opened(self, session_id: str) -> None:
        with self._lock:
            self._last[session_id] = self.now()

    def touch(self, session_id: str | None) -> None:
        with self._lock:
            if session_id in self._last:
                self._last[session_id] = self.now()
        if self.observer is not None and session_id is not None:
            self.observer(session_id)

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._last.pop(session_id, None)

    def unused_for(self, seconds: float) -> list[str]:
        with self._lock:
            cutoff = self.now() - seconds
            return [sid for sid, last in self._last.items() if last <= cutoff]

    def is_unused_for(self, session_id: str, seconds: float) -> bool:
        with self._lock:
            last = self._last.get(session_id)
            return last is not None and last <= self.now() - seconds

    def follow(self, events: EventBus) -> None:
        """Count the start and the end of every session turn as a use."""
        events.subscribe(RequestAdded, self._turn_started)
        for kind in (RequestFinished, RequestAborted, RequestFailed):
            events.subscribe(kind, self._turn_ended)

    def _turn_started(self, event: RequestAdded) -> None:
        if event.session_id is not None:
            self._turns[event.request_id] = event.session_id
            self.touch(event.session_id)

    def _turn_ended(self, event: RequestFinished | RequestAborted | RequestFailed) -> None:
        self.touch(self._turns.pop(event.request_id, None))


class IdleReaper:
    """Closes the sessions ``clock`` says nobody used for ``timeout`` seconds.

    ``run`` sweeps every ``min(timeout / 4, 1 s)`` until cancelled; ``sweep``
    is one round, so a caller (a test with its own clock) can decide when
    rounds happen. Which sessions a round closes depends only on the clock's
    readings and on which turns are in flight, never on when the round runs.
    """

    # the latest finished sweeps only (registry walks check it)
    __bounded__ = MappingProxyType({"_swept": SWEEPS_KEPT})

    def __init__(self, worker: EngineWorker, clock: SessionClock, timeout: float) -> None:
        self.worker, self.clock, self.timeout = worker, clock, timeout
        self._swept: deque[float] = deque(maxlen=SWEEPS_KEPT)  # finished sweeps' starts

    def sweeps_after(self, t: float) -> int:
        """How many of the last finished sweeps began after ``t`` (on the clock's time):
        each of them closed every session unused for the timeout when it began."""
        return sum(1 for began in list(self._swept) if began > t)

    @property
    def period(self) -> float:
        return min(self.timeout / 4, MAX_CHECK_PERIOD_S)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            try:
                await self.sweep()
            except Exception:  # keep reaping; the next round tries again
                log.exception("closing idle sessions failed")

    async def sweep(self) -> list[str]:
        """One round: the ids of the sessions it closed."""
        began = self.clock.now()
        stale = self.clock.unused_for(self.timeout)
        closed = []
        if stale:
            closed = await self.worker.run(
                close_if_idle, self.worker.engine, self.clock, stale, self.timeout
            )
        if closed:
            log.info("closed %d idle session(s): %s", len(closed), ", ".join(closed))
        self._swept.append(began)
        return closed


def close_if_idle(
    engine: Engine, clock: SessionClock, session_ids: list[str], timeout: float
) -> list[str]:
    """On the engine thread: close each session still unused and with no turn in flight.

    A session with a turn in flight (one that has run for the whole timeout) is
    left to the engine to refuse, as it refuses a client's close: it says so
    (``SessionBusy``), and a later round tries again.
    """
    closed, sessions = [], engine.open_sessions()  # closing one leaves the others as they are
    for sid in session_ids:
        if sid not in sessions:  # closed some other way meanwhile
            clock.forget(sid)
        elif clock.is_unused_for(sid, timeout):
            try:
                engine.close_session(sid, reason="idle timeout")
            except SessionError as exc:
                if exc.code != "session_busy":
                    raise
                continue
            clock.forget(sid)
            closed.append(sid)
    return closed
