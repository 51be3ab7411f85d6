"""``HistoryTarget``: what the history tier (``kvwatch.histories``) needs of an engine.

A target plays one history at a time on an engine of its own (``play``: so a
history's outcome depends on nothing played before it), says the engine's
``Shape`` (the size edges the generator aims its prompts at and what the
engine offers), and, where it has one, a cache-off ``Reference`` for the
equivalence check. ``describe()`` is the plain data a saved history keeps,
from which the history tier builds the same target again for a replay.

Two shapes of target keep it::

    LoopHistoryTarget    the engine's loop in kvwatch's process: a fresh ``EngineLoop``,
                         its ``StepProbe`` and ``CacheWatch`` per history, played here
    (a driver process)   the engine in a Python of its own (vLLM's): the same player run
                         there over the same loop contract, ``Played`` sent back as JSON
                         (``histories/played_json.py``)
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from kvwatch.harness.run_record import Candidate, Replay
from kvwatch.targets.driver.cache_watch import CacheWatch
from kvwatch.targets.driver.engine_loop import EngineLoop
from kvwatch.targets.driver.step_probe import StepProbe

if TYPE_CHECKING:
    from kvwatch.histories.ops import History
    from kvwatch.histories.play import Played

# finished requests replayed on a cache-off engine: each one's output there
Reference = Callable[[Sequence[Candidate]], Sequence[Replay]]


@dataclass(frozen=True)
class Shape:
    """What the generator knows of an engine: its size edges and what it offers."""

    engine: str
    page: int  # tokens per page (a cache key's unit)
    chunk: int  # the largest prefill chunk
    context: int  # prompt and output together, at most
    unit: int = 0  # a further edge: a big page, a hash unit (0: none)
    vocab: tuple[int, int] = (32, 127)  # token ids are drawn from [lo, hi)
    sessions: bool = True
    priorities: bool = False


class PlayedOn(NamedTuple):
    """A history as one engine played it, and what that engine calls a request it
    ended unasked (``EngineLoop.unasked``: the ``ended`` check's status)."""

    played: Played
    unasked: str


class HistoryTarget(ABC):
    engine: ClassVar[str]  # the engine's name in a saved history
    shape: Shape

    @abstractmethod
    def play(self, history: History) -> PlayedOn:
        """``history`` on a fresh engine: nothing of an earlier history is left in it."""

    @contextlib.contextmanager
    def opened(self) -> Iterator[None]:
        """What must hold while histories play (an engine's modules, its environment,
        a driver process)."""
        yield

    def reference(self) -> Reference | None:
        """Replays finished requests on a cache-off engine; None where there is none."""
        return None

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """Plain data that builds this target again."""


class LoopHistoryTarget(HistoryTarget):
    """An engine whose loop runs in kvwatch's process: a fresh loop per history."""

    @abstractmethod
    def make_loop(self) -> EngineLoop:
        """A new loop: fresh pools and cache."""

    @abstractmethod
    def make_probe(self, loop: EngineLoop) -> StepProbe:
        """The probe over ``loop``, observing it after every step."""

    def make_watch(self, loop: EngineLoop) -> CacheWatch | None:
        """The recorder of ``loop``'s cache index and references; None where the engine
        tells neither (the ``index`` and ``references`` checks are then skipped)."""
        return None

    def play(self, history: History) -> PlayedOn:
        from kvwatch.histories.play import play

        loop = self.make_loop()
        try:
            played = play(loop, self.make_probe(loop), history, self.make_watch(loop))
        finally:
            loop.close()
        return PlayedOn(played, loop.unasked)
