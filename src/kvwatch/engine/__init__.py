"""kvwatch.engine: the instrumented reference engine.

The public surface is small: build an ``Engine`` from an ``EngineConfig``,
add requests with ``SamplingParams``, and step it (or call ``generate``);
read it through the frozen records it answers with (``RequestInfo``,
``SessionInfo``, ``ComputedBatch`` for its ``on_batch_computed`` hooks).
Nothing here imports telemetry; subscribe to ``engine.events`` instead.

The names below load on first use, so a tool that only needs the fault
registry or the configs (``kvwatch gate`` checking ``--inject``) does not
pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {
    "CacheConfig": "kvwatch.engine.config",
    "EngineConfig": "kvwatch.engine.config",
    "ModelConfig": "kvwatch.engine.config",
    "SchedulerConfig": "kvwatch.engine.config",
    "SpecConfig": "kvwatch.engine.config",
    "Completion": "kvwatch.engine.engine",
    "ComputedBatch": "kvwatch.engine.views",
    "Engine": "kvwatch.engine.engine",
    "Fault": "kvwatch.engine.faults",
    "RequestInfo": "kvwatch.engine.views",
    "RequestOutput": "kvwatch.engine.request",
    "SamplingParams": "kvwatch.engine.request",
    "SessionInfo": "kvwatch.engine.views",
}

__all__ = [
    "CacheConfig",
    "Completion",
    "ComputedBatch",
    "Engine",
    "EngineConfig",
    "Fault",
    "ModelConfig",
    "RequestInfo",
    "RequestOutput",
    "SamplingParams",
    "SchedulerConfig",
    "SessionInfo",
    "SpecConfig",
]

if TYPE_CHECKING:
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
    from kvwatch.engine.views import ComputedBatch, RequestInfo, SessionInfo


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
