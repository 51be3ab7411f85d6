"""FinishedLog: the requests the engine finished that a cache-off engine must reproduce.

A request is *comparable* when its output is a function of its prompt and
its parameters alone: greedy, or sampled with a seed (every request samples
from a generator of its own). With ``--enable-probe`` the worker logs each
comparable request that finished (``stop`` or ``length``, no error) with its
prompt as the engine saw it (a session turn's prompt is the session's
tokens) and its output; ``GET /debug/finished`` hands them over and forgets
them. The equivalence check replays them on a cache-off engine.

The log keeps at most ``MAX_KEPT`` entries between two reads (the oldest go
first and are counted as ``dropped``), so a server nobody reads stays bounded.

Each entry also says what its request exercised (``marks``), heard from the
engine's events while it ran, so a replay budget can go to the requests most
likely to show wrong reuse first (``targets/kvwatch/replay.choose``):

    shallow         resumed from a snapshot shallower than the sliding window
    page-edge       resumed at a page's first or last token
    window-edge     resumed at the window's first or last token
    retracted       retracted, recomputed or loaded back later
    recovered       came back after a retraction or a pause (``RequestRecovered``)
    paused          paused and resumed
"""

from __future__ import annotations

import threading
from collections import deque
from types import MappingProxyType
from typing import NamedTuple

from kvwatch.engine.events import (
    EventBus,
    RequestAborted,
    RequestFailed,
    RequestPaused,
    RequestRecovered,
    RequestRetracted,
    RequestScheduled,
)
from kvwatch.engine.request import SamplingParams

MAX_KEPT = 8192


class FinishedRequest(NamedTuple):
    prompt: tuple[int, ...]
    output: tuple[int, ...]
    params: SamplingParams
    marks: tuple[str, ...] = ()  # what it exercised (the module's docstring)

    def to_json(self) -> dict:
        p = self.params
        return {
            "prompt": list(self.prompt),
            "output": list(self.output),
            "max_tokens": p.max_tokens,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "seed": p.seed,
            "stop_token_ids": list(p.stop_token_ids),
            "ignore_eos": p.ignore_eos,
            "marks": list(self.marks),
        }


def comparable(params: SamplingParams) -> bool:
    return params.greedy or params.seed is not None


class FinishedLog:
    # at most MAX_KEPT between two reads (registry walks check the bound)
    __bounded__ = MappingProxyType({"_kept": MAX_KEPT})

    def __init__(self, exercised: Exercised | None = None) -> None:
        self.exercised = exercised or Exercised(page=0, window=0)
        self._kept: deque[FinishedRequest] = deque(maxlen=MAX_KEPT)
        self._lock = threading.Lock()
        self._finished = self._dropped = self._tokens = 0

    def add(
        self, prompt: list[int], output: list[int], params: SamplingParams, request_id: str = ""
    ) -> None:
        """A request that finished well; kept when it is comparable, with its marks."""
        marks = self.exercised.done(request_id)
        with self._lock:
            self._finished += 1
            if not comparable(params):
                return
            self._dropped += len(self._kept) == MAX_KEPT
            self._kept.append(
                FinishedRequest(
                    prompt=tuple(prompt), output=tuple(output), params=params, marks=marks
                )
            )

    def ended(self, output_tokens: int) -> None:
        """Any request that ended (finished, aborted or failed), with the tokens it
        generated: what ``kvwatch_tokens_generated`` must have counted for it."""
        with self._lock:
            self._tokens += output_tokens

    def take(self) -> dict:
        """Everything kept since the previous call, how many finished in all, and the
        tokens every request that ended since generated."""
        with self._lock:
            kept, self._kept = list(self._kept), deque(maxlen=MAX_KEPT)
            out = {
                "requests": [r.to_json() for r in kept],
                "finished": self._finished,
                "dropped": self._dropped,
                "tokens": self._tokens,
            }
            self._finished = self._dropped = self._tokens = 0
        return out


class Exercised:
    """What each live request exercised, from the engine's events (thread-safe:
    the engine thread emits, the worker reads as the request finishes). An entry
    lives until its request finishes (``done``), is aborted or fails."""

    def __init__(self, page: int, window: int) -> None:
        self.page, self.window = page, window
        self._marks: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def follow(self, events: EventBus) -> None:
        events.subscribe(RequestScheduled, lambda e: self._resumed(e.request_id, e.cached_tokens))
        events.subscribe(RequestRetracted, lambda e: self._mark(e.request_id, "retracted"))
        events.subscribe(RequestPaused, lambda e: self._mark(e.request_id, "paused"))
        events.subscribe(RequestRecovered, self._recovered)
        for kind in (RequestAborted, RequestFailed):
            events.subscribe(kind, lambda e: self.done(e.request_id))

    def done(self, request_id: str) -> tuple[str, ...]:
        """The request's marks, sorted; its entry is forgotten."""
        with self._lock:
            return tuple(sorted(self._marks.pop(request_id, ())))

    def _recovered(self, event: RequestRecovered) -> None:
        self._mark(event.request_id, "recovered")
        self._resumed(event.request_id, event.resume_len)

    def _resumed(self, request_id: str, depth: int) -> None:
        """Marks for resuming at ``depth`` tokens: its place against the window and
        the pages (nothing for a request that starts from scratch)."""
        if depth <= 0 or not self.page:
            return
        if depth < self.window:
            self._mark(request_id, "shallow")
        if depth % self.page in (0, self.page - 1):
            self._mark(request_id, "page-edge")
        if self.window and depth % self.window in (0, self.window - 1):
            self._mark(request_id, "window-edge")

    def _mark(self, request_id: str, mark: str) -> None:
        with self._lock:
            self._marks.setdefault(request_id, set()).add(mark)
