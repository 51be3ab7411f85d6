"""``HistoryTarget``: what the history tier (``kvwatch.histories``) needs of an engine.

A target builds a fresh ``EngineLoop`` and its ``StepProbe`` for every history
played (so a history's outcome depends on nothing played before it), says
the engine's ``Shape`` (the size edges the generator aims its prompts at and
what the engine offers), and, where it has one, a cache-off ``Reference``
for the equivalence check. ``describe()`` is the plain data a saved history
keeps, from which the history tier builds the same target again for a replay.
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

    @abstractmethod
    def make_loop(self) -> EngineLoop:
        """A new loop: fresh pools and cache."""

    @abstractmethod
    def make_probe(self, loop: EngineLoop) -> StepProbe:
        """The probe over ``loop``, observing it after every step."""

    @contextlib.contextmanager
    def opened(self) -> Iterator[None]:
        """What must hold while histories play (an engine's modules, its environment)."""
        yield

    def make_watch(self, loop: EngineLoop) -> CacheWatch | None:
        """The recorder of ``loop``'s cache index and references; None where the engine
        tells neither (the ``index`` and ``references`` checks are then skipped)."""
        return None

    def reference(self) -> Reference | None:
        """Replays finished requests on a cache-off engine; None where there is none."""
        return None

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """Plain data that builds this target again."""
