"""Sessions idle past their timeout: each must be closed within the timeout and a margin.

``--session-idle-timeout T`` promises that a session nobody uses for T
seconds is closed, its slot released, busy server or not. The reaper
(``idle.py``) keeps that promise; this is the oracle for it, kept apart from
the code it judges: it hears every use itself and keeps its own clock.

    a use: the session routes (get, rollback, trajectory: through the clock's
        ``observer``), and the session's opening and the start and end of each
        of its turns (the engine's events, heard here on a subscription of its
        own); the engine's ``SessionClosed`` ends the watch
    the worker, after every step and at every probe ─► check(step, ...):
        a session the engine still holds open, with no turn in flight, unused
        for more than T + OVERDUE_S seconds, is an ``overdue`` finding once the
        server could not have missed it: OVERDUE_STEPS engine steps ran since
        it fell due (a busy server), or the reaper finished two sweeps that
        began after it fell due (an idle one)
    /debug/probe ─► findings(): the ones found since the previous probe

The margin is both seconds and work done, as for the departures oracle: a
busy machine may delay a sweep by a second or two, but not through dozens of
engine steps or two whole sweeps, each of which closes every session found
unused for T at that moment (``close_if_idle``). A session whose turn is in
flight is left alone: the engine refuses to close it, by design, until the
turn ends, which is a use.

Bounded: an entry lives while its session is open (until its
``SessionClosed``), and at most ``MAX_KEPT`` findings wait for a probe.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from types import MappingProxyType

from kvwatch.contracts import Finding, FindingKind, finding
from kvwatch.engine.events import (
    EventBus,
    RequestAborted,
    RequestAdded,
    RequestFailed,
    RequestFinished,
    SessionClosed,
    SessionOpened,
)

OVERDUE_S = 3.0
OVERDUE_STEPS = 32
SWEEPS = 2  # finished sweeps that began after the session fell due
MAX_KEPT = 32


class IdleDeadlines:
    """The idle-timeout oracle for one server (``timeout`` seconds)."""

    # found but not yet probed: at most MAX_KEPT (registry walks check it)
    __bounded__ = MappingProxyType({"_found": MAX_KEPT})

    def __init__(
        self,
        timeout: float,
        sweeps_after: Callable[[float], int],
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        """``sweeps_after(t)``: how many of the reaper's sweeps began after ``t`` and
        finished (``IdleReaper.sweeps_after``)."""
        self.timeout, self.sweeps_after, self.now = timeout, sweeps_after, now
        self._last: dict[str, float] = {}  # session id -> its last use
        self._due_step: dict[str, int] = {}  # session id -> the first step seen past its due
        self._turns: dict[str, str] = {}  # request id -> session id, while the turn runs
        self._reported: set[str] = set()  # sessions found overdue (each once)
        self._found: deque[Finding] = deque(maxlen=MAX_KEPT)
        self._lock = threading.Lock()

    # -- what it hears ---------------------------------------------------------------
    def opened(self, session_id: str) -> None:
        """The engine opened ``session_id``: its watch begins, as a use."""
        with self._lock:
            self._last[session_id] = self.now()

    def used(self, session_id: str) -> None:
        """From any thread: ``session_id`` was used (nothing for a session not open)."""
        with self._lock:
            if session_id in self._last:
                self._last[session_id] = self.now()
                self._due_step.pop(session_id, None)

    def follow(self, events: EventBus) -> None:
        """Hear, from the engine's own events, each session opened and closed and
        the start and the end of every session turn (each a use), and so the
        turns in flight."""
        events.subscribe(SessionOpened, lambda e: self.opened(e.session_id))
        events.subscribe(SessionClosed, lambda e: self._drop(e.session_id))
        events.subscribe(RequestAdded, self._turn_started)
        for kind in (RequestFinished, RequestAborted, RequestFailed):
            events.subscribe(kind, self._turn_ended)

    def _turn_started(self, event: RequestAdded) -> None:
        if event.session_id is not None:
            self._turns[event.request_id] = event.session_id
            self.used(event.session_id)

    def _turn_ended(self, event: RequestFinished | RequestAborted | RequestFailed) -> None:
        if (sid := self._turns.pop(event.request_id, None)) is not None:
            self.used(sid)

    # -- the check -------------------------------------------------------------------
    def check(self, step: int, open_ids: Callable[[], Collection[str]]) -> None:
        """On the worker thread: each open session past its due by the margin becomes
        a finding. ``open_ids`` reads the engine's open sessions (called only when
        some session is past due)."""
        now = self.now()
        with self._lock:
            due = {sid: last + self.timeout for sid, last in self._last.items()}
        late = {sid: d for sid, d in due.items() if now > d and sid not in self._reported}
        if not late:
            return
        still_open = open_ids()
        busy = set(self._turns.values())
        for sid, d in late.items():
            if sid not in still_open or sid in busy:
                continue
            with self._lock:
                first = self._due_step.setdefault(sid, step)
            worked = step - first >= OVERDUE_STEPS or self.sweeps_after(d) >= SWEEPS
            if now - d >= OVERDUE_S and worked:
                self._reported.add(sid)
                self._found.append(self._finding(sid, now - d + self.timeout, step - first))

    def _drop(self, session_id: str) -> None:
        with self._lock:
            self._last.pop(session_id, None)
            self._due_step.pop(session_id, None)
            self._reported.discard(session_id)

    def _finding(self, session_id: str, idle: float, steps: int) -> Finding:
        detail = (
            f"session {session_id} unused for {idle:.1f} s, past its {self.timeout:g} s "
            f"idle timeout by more than {OVERDUE_S:g} s ({steps} engine steps since), "
            "and still open: the idle timeout never closed it"
        )
        return finding(FindingKind.OVERDUE, None, [], detail, key=session_id)

    def findings(self) -> tuple[Finding, ...]:
        """The sessions found overdue since the previous call."""
        out = tuple(self._found)
        self._found.clear()
        return out
