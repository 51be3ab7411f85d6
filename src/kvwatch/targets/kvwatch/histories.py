"""kvwatch's own engine as a ``HistoryTarget``: stepped in process, small pools.

The engine the history tier plays on is the reference engine with pools small
enough that generated histories run into memory pressure (retraction under
pressure, eviction, slots dropped), a scheduled retraction every few steps
(so a ``retracted`` stage is reached at any load), speculative decoding (a
``verifying`` stage), short chunks and a 512-token context (requests that
exactly fill it are cheap). ``sets`` are ``--engine-set`` assignments on top,
``faults`` the faults switched on; both are kept in a saved history.

Its reference is kvwatch's equivalence replay (``replay.Reference``): the same
model with the cache off, so every finished request is checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvwatch.engine import EngineConfig
from kvwatch.engine.overrides import apply_overrides, assignment
from kvwatch.harness.profiles import merge
from kvwatch.targets.driver.history_target import LoopHistoryTarget, Reference, Shape
from kvwatch.targets.kvwatch.cache_watch import EngineCacheWatch
from kvwatch.targets.kvwatch.loop import KvwatchLoop
from kvwatch.targets.kvwatch.probe import EngineProbe
from kvwatch.targets.kvwatch.replay import Reference as CacheOff

STATE = {"capacity": 16, "host_capacity": 16}
HISTORY_ENGINE: dict[str, Any] = {
    "model": {"max_model_len": 512},
    "cache": {
        "full_kv": {"capacity": 96},
        "swa_kv": {"capacity": 64},
        "swa_window": STATE,
        "linear_state": STATE,
    },
    "scheduler": {
        "max_running": 8,
        "chunk_size": 32,
        "max_batch_tokens": 128,
        "retract_every": 7,
        "spec": {"num_drafts": 3},
    },
}


class KvwatchHistoryTarget(LoopHistoryTarget):
    engine = "kvwatch"

    def __init__(self, sets: Sequence[str] = (), faults: Sequence[str] = ()) -> None:
        self.sets, self.faults = tuple(sets), tuple(faults)
        data = HISTORY_ENGINE
        for text in self.sets:
            data = merge(data, assignment(text))  # ValueError: not KEY=VALUE
        config = apply_overrides(EngineConfig(), data)  # ValueError: a bad setting
        self.config = apply_overrides(config, {"faults": list(self.faults)})
        cache, sched = self.config.cache, self.config.scheduler
        self.shape = Shape(
            engine=self.engine,
            page=cache.page_size,
            chunk=sched.chunk_size,
            context=self.config.model.max_model_len,
            unit=cache.snapshot_interval,
        )

    def make_loop(self) -> KvwatchLoop:
        return KvwatchLoop(self.config)

    def make_probe(self, loop: KvwatchLoop) -> EngineProbe:  # type: ignore[override]
        return EngineProbe(loop)

    def make_watch(self, loop: KvwatchLoop) -> EngineCacheWatch:  # type: ignore[override]
        return EngineCacheWatch(loop)

    def reference(self) -> Reference:
        return CacheOff(self.config).replay

    def describe(self) -> dict[str, Any]:
        return {"engine": self.engine, "sets": list(self.sets), "faults": list(self.faults)}
