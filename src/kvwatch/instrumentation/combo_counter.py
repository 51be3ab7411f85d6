"""CombinationCounter: counts the combination and boundary edges of ``combos.py``
from the engine's events, the way ``LifecycleCounter`` counts transitions.

It only listens. Per live request it keeps the request's stage (the request
machine's states), its path key, prompt length and prompt digest; per live
path key the requests on it; per open session its turn in flight, whether
its last turn was cut, and whether a client's close was refused. All of it
goes when the request ends or the session closes, so the counter holds only
what is live. How each edge is counted:

* turn abort: RequestAborted of a session's turn, from the turn's stage (a
  ``verify`` abort from ``verifying``);
* same path: at RequestRetracted, RequestRecovered and NodeEvicted, one edge
  per kind of stage (prefilling; queued or waiting; retracted) among the other
  live requests with the same path key, before the mover changes stage;
* session op: SessionBusy (refused, from the turn's stage), SessionRolledBack
  and SessionClosed (from "cut" when the last turn was aborted or failed and no
  new one started, else "no turn"; and from "refused" once a client's close was
  refused);
* boundaries: at RequestScheduled (first admission), its ``branch_tokens`` b
  modulo the page and the window when 0 < b < prompt length, its prompt
  length's residues, and a sibling: another live request on its path with the
  same prompt length and another prompt digest.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

from kvwatch.engine.events import (
    EventBus,
    FailpointFired,
    NodeEvicted,
    RequestAborted,
    RequestAdded,
    RequestFailed,
    RequestFinished,
    RequestPaused,
    RequestRecovered,
    RequestRetracted,
    RequestScheduled,
    RequestWaiting,
    SessionBusy,
    SessionClosed,
    SessionOpened,
    SessionRolledBack,
    SpecVerified,
    TokensGenerated,
)
from kvwatch.instrumentation import combos
from kvwatch.instrumentation.combos import MACHINES

# a request's stage -> what a crossing on its path calls it (others: not counted)
_CROSSED = {
    "prefilling": "prefilling",
    "queued": "queued",
    "waiting": "queued",
    "retracted": "retracted",
}
# a turn in flight that computes nothing: not admitted yet, or stepped back
_PARKED = frozenset({"queued", "waiting", "retracted", "paused"})


@dataclass(slots=True)
class _Live:
    """A live request: its stage (the request machine's state) and its keys."""

    stage: str
    path: int
    prompt_len: int
    prompt: int
    session: str | None


@dataclass(slots=True)
class _Session:
    """An open session: its turn in flight, whether its last turn was cut, and
    whether a client's close was refused since it opened."""

    turn: str | None = None
    cut: bool = False
    refused: bool = False


class CombinationCounter:
    """Counts combination and boundary edges from engine events. One writer (the
    engine thread); ``taken`` copies under a lock. ``page`` and ``window``: the
    engine's full.kv page size and sliding window, the moduli of the offsets."""

    # one count per edge the machines list, and some unlisted (registry walks check it)
    __bounded__ = MappingProxyType({"counts": sum(len(m[2]) for m in MACHINES) + 64})

    def __init__(self, events: EventBus, *, page: int, window: int) -> None:
        self.page, self.window = page, window
        # every listed edge has its entry from the start, so the table never grows
        # while a load runs (a first-time edge late in a run is no new allocation)
        self.counts: Counter[tuple[str, str]] = Counter(
            {(name, edge): 0 for name, _, edges in MACHINES for edge in edges}
        )
        self.live: dict[str, _Live] = {}
        self.paths: dict[int, set[str]] = {}  # path key -> its live requests
        self.sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()
        self._unsubscribe = [events.subscribe(t, h) for t, h in self._handlers().items()]

    def _handlers(self) -> dict[type, Callable]:
        return {
            RequestAdded: self._added,
            RequestWaiting: self._waiting,
            RequestScheduled: self._scheduled,
            TokensGenerated: self._tokens,
            SpecVerified: self._verified,
            RequestRetracted: self._retracted,
            RequestPaused: self._paused,
            RequestRecovered: self._recovered,
            RequestFinished: self._finished,
            RequestAborted: self._aborted,
            RequestFailed: self._failed,
            NodeEvicted: self._evicted,
            SessionOpened: self._opened,
            SessionBusy: self._busy,
            SessionRolledBack: self._rolled_back,
            SessionClosed: self._closed,
            FailpointFired: self._failpoint,
        }

    def taken(self) -> dict[str, dict[str, int]]:
        """Edges taken so far, per machine (``{"turn abort": {"queued -> aborted": 2}}``)."""
        with self._lock:
            items = list(self.counts.items())
        out: dict[str, dict[str, int]] = {m[0]: {} for m in MACHINES}
        for (machine, edge), n in sorted(items):
            if n:
                out.setdefault(machine, {})[edge] = n
        return out

    def close(self) -> None:
        for unsubscribe in self._unsubscribe:
            unsubscribe()

    def _count(self, machine: str, edge: str) -> None:
        with self._lock:
            self.counts[machine, edge] += 1

    def _failpoint(self, e: FailpointFired) -> None:
        self._count(combos.FAILPOINT, combos.failed(e.site))

    # -- requests -------------------------------------------------------------------------
    def _added(self, e: RequestAdded) -> None:
        self.live[e.request_id] = _Live(
            stage="queued",
            path=e.path_key,
            prompt_len=e.prompt_tokens,
            prompt=e.prompt_key,
            session=e.session_id,
        )
        if e.path_key:
            self.paths.setdefault(e.path_key, set()).add(e.request_id)
        if (session := self.sessions.get(e.session_id)) is not None:
            session.turn, session.cut = e.request_id, False

    def _stage(self, rid: str, stage: str) -> None:
        if (live := self.live.get(rid)) is not None:
            live.stage = stage

    def _waiting(self, e: RequestWaiting) -> None:
        self._stage(e.request_id, "waiting")

    def _tokens(self, e: TokensGenerated) -> None:
        live = self.live.get(e.request_id)
        if live is not None and live.stage in ("prefilling", "recovering", "verifying"):
            live.stage = "decoding"

    def _verified(self, e: SpecVerified) -> None:
        self._stage(e.request_id, "verifying")

    def _paused(self, e: RequestPaused) -> None:
        self._stage(e.request_id, "paused")

    def _retracted(self, e: RequestRetracted) -> None:
        if (live := self.live.get(e.request_id)) is not None:
            self._crossing("retracted", live.path, e.request_id)
            live.stage = "retracted"

    def _recovered(self, e: RequestRecovered) -> None:
        if (live := self.live.get(e.request_id)) is not None:
            self._crossing("recovered", live.path, e.request_id)
            live.stage = "recovering"

    def _evicted(self, e: NodeEvicted) -> None:
        self._crossing("evicted", e.path_key, None)

    def _crossing(self, mover: str, path: int, rid: str | None) -> None:
        """One same-path edge per kind of stage the other live requests on ``path`` are in."""
        stages = {self.live[o].stage for o in self.paths.get(path, ()) if o != rid}
        for other in sorted({_CROSSED[s] for s in stages if s in _CROSSED}):
            self._count(combos.SAME_PATH, combos.same_path(mover, other))

    def _finished(self, e: RequestFinished) -> None:
        self._ended(e.request_id, cut=False)

    def _failed(self, e: RequestFailed) -> None:
        self._ended(e.request_id, cut=True)

    def _aborted(self, e: RequestAborted) -> None:
        live = self.live.get(e.request_id)
        if live is not None and live.session is not None:
            stage = "verifying" if e.stage == "verify" else live.stage
            self._count(combos.TURN_ABORT, f"{stage} -> aborted")
        self._ended(e.request_id, cut=True)

    def _ended(self, rid: str, *, cut: bool) -> None:
        live = self.live.pop(rid, None)
        if live is None:
            return
        if (on_path := self.paths.get(live.path)) is not None:
            on_path.discard(rid)
            if not on_path:
                del self.paths[live.path]
        session = self.sessions.get(live.session)
        if session is not None and session.turn == rid:
            session.turn, session.cut = None, cut

    # -- boundaries -----------------------------------------------------------------------
    def _scheduled(self, e: RequestScheduled) -> None:
        live = self.live.get(e.request_id)
        if live is None:
            return
        live.stage = "prefilling"
        n, b = live.prompt_len, e.branch_tokens
        if 0 < b < n:
            self._count(combos.PAGE_OFFSET, combos.offset(b, self.page))
            self._count(combos.WINDOW_OFFSET, combos.offset(b, self.window))
        for modulus in (self.page, self.window):
            if n % modulus in (modulus - 1, 0, 1):
                self._count(combos.PROMPT_END, combos.prompt_end(n % modulus, modulus))
        if self._has_sibling(e.request_id, live):
            self._count(combos.SIBLINGS, combos.EQUAL_LENGTH)

    def _has_sibling(self, rid: str, live: _Live) -> bool:
        """Another live request on the same path, as long, with another prompt."""
        for other in self.paths.get(live.path, ()):
            o = self.live[other]
            if other != rid and o.prompt_len == live.prompt_len and o.prompt != live.prompt:
                return True
        return False

    # -- sessions -------------------------------------------------------------------------
    def _opened(self, e: SessionOpened) -> None:
        self.sessions[e.session_id] = _Session()

    def _busy(self, e: SessionBusy) -> None:
        session, live = self.sessions.get(e.session_id), self.live.get(e.request_id)
        if session is None or live is None:
            return
        turn = "queued" if live.stage in _PARKED else "running"
        self._count(combos.SESSION_OP, combos.session_op(e.action, turn, "refused"))
        if e.action == "close":
            session.refused = True

    def _rolled_back(self, e: SessionRolledBack) -> None:
        if (session := self.sessions.get(e.session_id)) is not None:
            turn = "cut" if session.cut else "no turn"
            self._count(combos.SESSION_OP, combos.session_op("rollback", turn, "rolled back"))
            session.cut = False

    def _closed(self, e: SessionClosed) -> None:
        session = self.sessions.pop(e.session_id, None)
        if session is None:
            return
        action, outcome = (
            ("idle timeout", "timed out") if e.reason == "idle timeout" else ("close", "closed")
        )
        turn = "cut" if session.cut else "no turn"
        self._count(combos.SESSION_OP, combos.session_op(action, turn, outcome))
        if session.refused:
            self._count(combos.SESSION_OP, combos.session_op(action, "refused", outcome))
