"""The shared ``Workload`` base: a seeded load played turn by turn as operations on an ``EngineLoop``.

A workload is seeded (every token id from one ``Random``), keeps its
conversations' histories and the sessions it opened, and plays one turn at a
time: ``turn(loop, t)`` submits the turn's requests (all at once, so they share
the engine's batches) and runs the loop until it is idle, then says how many
conversations are live and how many tokens they hold (``TurnStats``, what the
recorder's barrier wants). What the clients do while the loop runs is a
``Schedule`` of operations:

    at[k]    run just before the loop's k-th step of this run (a late arrival,
             an abort at a chosen step): the engine takes them at that step
    when     (due, then) pairs, checked before every step: an abort once its
             client sees its request reach a stage (a chunk prefilled, tokens out)

``run_until_idle`` steps the loop through a schedule; a loop that watches its
liveness (``stalled``) has its clients give up once, aborting what is live.

Invariant: a workload changes the engine only through the loop's operations
(``submit``, ``abort``, ``open_session``, ``close_session``, ``step``), so the
same (workload, c, seed) is the same sequence of operations on every build of
the engine. This module imports nothing but the standard library (vLLM's
driver process reads it in vLLM's own Python).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

if TYPE_CHECKING:
    from kvwatch.targets.driver.engine_loop import EngineLoop

Operation = Callable[[], object]


class TurnStats(NamedTuple):
    conversations: int
    context_tokens: int


class Trigger(NamedTuple):
    due: Callable[[], bool]  # what the client watches
    then: Operation  # what it does, once, when it sees it


@dataclass
class Schedule:
    """What the clients do while the loop runs to idle (one run of ``run_until_idle``)."""

    at: dict[int, list[Operation]] = field(default_factory=dict)
    when: list[Trigger] = field(default_factory=list)

    def before_step(self, k: int, operation: Operation) -> None:
        self.at.setdefault(k, []).append(operation)

    def once(self, due: Callable[[], bool], then: Operation) -> None:
        self.when.append(Trigger(due, then))


@dataclass(frozen=True)
class IdleRule:
    """How a loop is run to idle: the steps it may take, the error when it does not
    get idle in them, whether its clients give up once it stalls, and whether one
    more (idle) step follows (a loop that keeps polling reaps deferred work then)."""

    max_steps: int
    stuck: str  # the error's text; ``{n}`` is ``max_steps``
    give_up: bool = False
    # with give_up: at every stall, abort each live request not aborted so far (requests
    # sent after an earlier stall too), not only those live at the first stall
    give_up_each: bool = False
    idle_step: bool = False


class Stuck(RuntimeError):
    """The loop did not get idle in the steps its ``IdleRule`` allows."""


def _fire(schedule: Schedule) -> None:
    for trigger in list(schedule.when):
        if trigger.due():
            trigger.then()
            schedule.when.remove(trigger)


def run_until_idle(loop: EngineLoop, schedule: Schedule | None, rule: IdleRule) -> int:
    """Step ``loop`` until it is idle and every scheduled operation ran; the steps taken.

    Before each step: the triggers that are due fire; the loop stops once idle with
    no operation left for a later step; with ``give_up``, a stalled loop's clients
    abort every live request, once (``give_up_each``: at every stall, each request
    once); then the operations scheduled for this step run.
    ``Stuck(rule.stuck)`` (a ``RuntimeError``) once ``rule.max_steps`` steps did not
    get it idle.
    """
    schedule = schedule or Schedule()
    at, k, gave_up, given_up = dict(schedule.at), 0, False, set()
    while True:
        if k >= rule.max_steps:
            raise Stuck(rule.stuck.format(n=rule.max_steps))
        _fire(schedule)
        if loop.idle() and not any(i >= k for i in at):
            schedule.when.clear()
            break
        if rule.give_up and not gave_up and loop.stalled():
            gave_up = not rule.give_up_each
            for rid in [r for r in loop.live_rids() if r not in given_up]:
                given_up.add(rid)
                loop.abort(rid)
        for operation in at.pop(k, []):
            operation()
        loop.step()
        k += 1
    if rule.idle_step:
        loop.step()
    return k


class Workload:
    """A seeded load: ``start``, then ``turn`` per turn, then ``close``."""

    name: ClassVar[str] = "base"
    summary: ClassVar[str] = ""
    sessions: ClassVar[bool] = False  # it needs the engine's sessions
    vocab: ClassVar[int] = 30_000  # token ids are drawn from [3, vocab)
    idle_rule: ClassVar[IdleRule] = IdleRule(
        max_steps=20_000, stuck="the loop did not get idle in {n} steps"
    )

    def __init__(self, *, c: int = 4, seed: int = 0) -> None:
        self.c, self.seed = c, seed
        self.rng = random.Random(seed)
        self.histories: dict[str, list[int]] = {}
        self.opened: list[str] = []  # every session it opened

    def tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(3, self.vocab) for _ in range(n)]

    def start(self, loop: Any) -> None:
        """Before the first turn (the recorder's baseline is already taken)."""

    def turn(self, loop: Any, t: int) -> TurnStats:
        raise NotImplementedError

    def close(self, loop: Any) -> None:
        """After the last turn: end what the conversations keep open (sessions)."""

    def stats(self) -> TurnStats:
        held = sum(len(h) for h in self.histories.values())
        return TurnStats(conversations=len(self.histories), context_tokens=held)

    def open(self, loop: Any, session_id: str) -> None:
        loop.open_session(session_id)
        self.opened.append(session_id)

    def run(self, loop: Any, schedule: Schedule | None = None) -> int:
        """Step ``loop`` until idle through ``schedule`` (``run_until_idle``)."""
        return run_until_idle(loop, schedule, self.idle_rule)
