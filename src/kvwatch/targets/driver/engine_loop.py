"""``EngineLoop``: the contract an engine run in kvwatch's process keeps for the shared driver.

An engine whose own scheduling loop kvwatch steps itself (SGLang's
``Scheduler``, LightLLM's infer loop, vLLM's scheduler in its driver process)
is seen through five operations, the only ways a client history can change
its state, and its reads::

    submit(rid, prompt, max_new, **options) -> handle   a client sends a request
    abort(rid)                                         a client gives up on one
    step()                                             one iteration of the engine's own loop
    flush() -> bool                                    everything evictable evicted, through
                                                       the engine's own eviction (False: busy)
    open_session(sid) / close_session(sid)             engines with sessions only
    idle() -> bool                                     nothing live, nothing waiting to be sent
    steps: int                                         steps taken so far
    outcomes: list[Outcome]                            what ended, how and at which step
    stage(rid) / admitted(rid)                         where a request is; whether it ran
    input_of(rid) / output_of(rid)                     what it computed over; what it gave
    hit_of(rid)                                        what it found cached at admission

and ``close()`` once the run is over. An operation the engine turns down at
once raises ``Refused`` (a client reads a 4xx); the last four reads answer
None, or nothing, where a loop cannot tell (the history tier checks what it
can). After every step and abort the loop calls its ``observers`` (the probe
notes who holds what). What a client would count of
the outcomes is the engine's to say: ``FINISHED`` is answered, the statuses in
``on_purpose`` are what the load provoked (answered 4xx), ``unasked`` is a
request the engine ended without being asked (failed), described by ``failure``.
A loop that watches its own liveness says so through ``stalled``: the engine
stopped admitting with requests waiting, so its clients give up on
``live_rids``.

Invariant: nothing outside these operations changes the engine's state, so a
sequence of them (a workload's turns, or a generated history of operations
placed at chosen steps) is the whole of what a run did to the engine. This
module imports nothing but the standard library: vLLM's driver process
imports it in vLLM's own Python.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

FINISHED = "finished"  # ran to its end: answered
ABORTED = "aborted"  # its client aborted it


class Refused(Exception):
    """The engine turned an operation down at once (a client reads a 4xx): a
    session busy or unknown, a prompt it cannot take. Nothing changed."""


class Outcome(NamedTuple):
    """What became of one request, as its client would hear it."""

    rid: Any  # the id the request was submitted under
    status: str  # FINISHED, ABORTED, or one of the engine's own statuses
    step: int  # the loop's step count when it ended
    why: str = ""  # the engine's own message, where it gave one


class EngineLoop(ABC):
    engine: ClassVar[str] = "the engine"  # its name in what a client reads
    step_word: ClassVar[str] = "step"  # what one step is called in progress lines
    on_purpose: ClassVar[tuple[str, ...]] = (ABORTED,)  # what the load provokes: 4xx
    unasked: ClassVar[str] = "ended-by-the-engine"  # ended without being asked: failed
    # True: an exception the engine raises ends its loop, as it would end its process,
    # and the run is judged on the state it left (a barrier that does not drain, and
    # the requests counted up to there)
    judged_where_it_broke: ClassVar[bool] = False
    steps: int  # steps taken so far (what ``Outcome.step`` counts): each loop keeps it
    # what a session keeps of a turn: "finished" (a finished turn's input and output;
    # nothing of a turn that did not finish), "ran" (also a turn cut after it was
    # admitted, its prompt and the output so far; one that never ran, nothing) or
    # "finished-less-last" (a finished turn's input and output but its last token:
    # vLLM's streaming input, whose next chunk drops the last sampled token, its KV
    # never computed)
    session_keeps: ClassVar[str] = "finished"
    # True: a next turn sent while its session's previous one is live waits behind it
    # and builds on it (vLLM's streaming input queues the chunk); False: it builds on
    # what the session had committed when it was sent
    session_queues_turns: ClassVar[bool] = False

    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []
        self.observers: list[Callable[[], None]] = []  # after every step (and abort)

    # -- the operations ----------------------------------------------------------------------
    @abstractmethod
    def submit(self, rid: Any, prompt: list[int], max_new: int, **options: Any) -> Any:
        """Send a request; a handle the workload reads its answer from."""

    @abstractmethod
    def abort(self, rid: Any) -> None:
        """The request's client gives up on it."""

    @abstractmethod
    def step(self) -> Any:
        """One iteration of the engine's own loop; what it raises comes out."""

    @abstractmethod
    def flush(self) -> bool:
        """Evict everything evictable through the engine's own eviction; False, and
        nothing done, while requests are live."""

    def open_session(self, session_id: str) -> None:
        raise NotImplementedError(f"{self.engine} has no sessions here")

    def close_session(self, session_id: str) -> None:
        raise NotImplementedError(f"{self.engine} has no sessions here")

    # -- what it reads -----------------------------------------------------------------------
    @abstractmethod
    def idle(self) -> bool:
        """Nothing live and nothing waiting to be sent."""

    def live_rids(self) -> list[Any]:
        """The requests still live, which the clients abort when they give up."""
        return []

    def stalled(self) -> bool:
        """Whether the engine stopped admitting with requests waiting (its clients
        give up); False where the loop does not watch its liveness."""
        return False

    def session_open(self, session_id: str) -> bool:
        """Whether the engine still holds ``session_id`` open (False: no sessions)."""
        return False

    def stage(self, rid: Any) -> str | None:
        """Where a live request is now (``queued``, ``prefilling``, ``decoding``,
        ``retracted``, ``paused``, or the engine's own word); None once it ended,
        or where the loop cannot tell."""
        return None

    def input_of(self, rid: Any) -> tuple[int, ...] | None:
        """The tokens the engine computes the request over (a session turn: the
        session's so far and the turn's own); None where the loop cannot read them."""
        return None

    def admitted(self, rid: Any) -> bool:
        """Whether the engine ever admitted the request (it ran, at least a chunk)."""
        return False

    def hit_of(self, rid: Any) -> int | None:
        """Prompt tokens the engine found cached when it first admitted the request
        (the tokens its matched pages are taken to hold); None where it cannot tell."""
        return None

    def output_of(self, rid: Any) -> tuple[int, ...]:
        """The tokens the request generated (so far, or in all once it ended)."""
        return ()

    def failure(self, ended: Outcome) -> dict:
        """How a client reports a request the engine ended unasked (``first_failures``)."""
        return {"name": str(ended.rid), "status": 0, "error": f"ended at step {ended.step}"}

    def notify(self) -> None:
        """Every observer, once (the probe notes who holds what)."""
        for observe in self.observers:
            observe()

    def close(self) -> None:  # noqa: B027 (optional: most loops hold nothing to end)
        """The run is over (a loop with a thread ends it)."""
