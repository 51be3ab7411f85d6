"""``HistoryTarget``: what the history tier (``kvwatch.histories``) needs of an engine.

Every history is played on an engine of its own (so its outcome depends on
nothing played before it). A target says the engine's ``Shape`` (the size
edges the generator aims its prompts at and what the engine offers), and,
where it has one, a cache-off ``Reference`` for the equivalence check.
``describe()`` is the plain data a saved history keeps, from which the history
tier builds the same target again for a replay. Two shapes of target::

    LoopHistoryTarget     the engine's loop in kvwatch's process: a fresh ``EngineLoop``,
                          its ``StepProbe`` and ``CacheWatch`` per history, which the
                          history tier plays here
    ProcessHistoryTarget  the engine apart (vLLM's Python): ``answer`` sends the history
                          to a driver process, which plays it with the same player over
                          the same loop contract and answers with plain JSON

Only the history tier (a layer above) knows what a played history is.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from kvwatch.harness.run_record import Candidate, Replay
from kvwatch.targets.driver.cache_watch import CacheWatch
from kvwatch.targets.driver.engine_loop import EngineLoop
from kvwatch.targets.driver.step_probe import StepProbe

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


class HistoryTarget(ABC):
    engine: ClassVar[str]  # the engine's name in a saved history
    shape: Shape

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
    """An engine whose loop runs in kvwatch's process: a fresh loop per history, which
    the history tier plays (``histories/play.py``)."""

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


class ProcessHistoryTarget(HistoryTarget):
    """An engine that runs apart (vLLM's Python): a driver process plays each history
    there with the same player (``histories/driver_process.py``) and answers with the
    played history as plain JSON."""

    @abstractmethod
    def answer(self, history: dict[str, Any]) -> dict[str, Any]:
        """``history`` (``History.to_json()``) played on a fresh engine of the driver
        process: ``{"played": ..., "unasked": ...}`` (``histories/played_json.py``)."""
