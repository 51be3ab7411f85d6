"""The recorder's probe source for a scheduler driver in this process: kvwatch's
``CallableSource`` with the probe's per-step watching, its flush, and the driver's
session registry.

``TurnRecorder`` (``kvwatch.harness.recorder``) asks its source for probes, a
flush once the run drained, the reports the engine kept between barriers
(``latched``) and whether each session the load opened is still open. Here
every answer comes from the driver (SGLang's own scheduler or the shim) and
its ``CacheProbe``; there is no heap sampler (the target does not claim
``Signal.HEAP``: ``cache_target.py`` says why) and nothing is replayed.

Invariant: only ``watch``, ``latched`` (``kvwatch.targets.driver.step_probe``'s
``StepSource``) and ``session_open`` differ from ``CallableSource``.
"""

from __future__ import annotations

from typing import Any

from kvwatch.targets.driver.step_probe import StepSource
from kvwatch.targets.sglang.probe import CacheProbe


class ShimSource(StepSource):
    def __init__(self, probe: CacheProbe) -> None:
        super().__init__(probe)
        self.cache_probe = probe

    def session_open(self, session_id: str) -> bool:
        """Whether SGLang's session controller still holds ``session_id``."""
        sessions: Any = self.cache_probe.shim.sessions
        return sessions is not None and session_id in sessions.sessions
