"""``EngineProbe``: kvwatch's own engine, stepped in process, read as a ``StepProbe``.

Its report is the engine's own (``Engine.probe``: the audit over every pool,
the tree and the slots, usage and bounds), the one ``GET /debug/probe``
answers over HTTP. The audit names who holds each page, so there is no
last-holder bookkeeping to keep between steps (``holdings`` is empty).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kvwatch.contracts import ProbeReport
from kvwatch.targets.driver.step_probe import StepProbe
from kvwatch.targets.kvwatch.loop import KvwatchLoop


class EngineProbe(StepProbe):
    def __init__(self, loop: KvwatchLoop) -> None:
        super().__init__()
        self.loop = loop
        loop.observers.append(self.remember)

    def report(self) -> ProbeReport:
        return self.loop.core.probe()

    def holdings(self) -> Iterable[tuple[str, Sequence[Any]]]:
        return ()
