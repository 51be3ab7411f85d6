"""kvwatch.engine: the instrumented reference engine.

The public surface is small: build an ``Engine`` from an ``EngineConfig``,
add requests with ``SamplingParams``, and step it (or call ``generate``).
Nothing here imports telemetry; subscribe to ``engine.events`` instead.
"""

from kvwatch.engine.config import (
    CacheConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    SpecConfig,
)
from kvwatch.engine.engine import Completion, Engine
from kvwatch.engine.faults import Fault
from kvwatch.engine.request import RequestOutput, SamplingParams

__all__ = [
    "CacheConfig",
    "Completion",
    "Engine",
    "EngineConfig",
    "Fault",
    "ModelConfig",
    "RequestOutput",
    "SamplingParams",
    "SchedulerConfig",
    "SpecConfig",
]
