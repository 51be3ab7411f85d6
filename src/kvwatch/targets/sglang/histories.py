"""SGLang's own scheduler as a ``HistoryTarget``: a release stepped in process, by named setup.

The history tier plays on the release's ``Scheduler`` (``loop.SchedulerLoop``)
with one of ``SETUPS``, each a set of server options users turn on, sized so
that generated histories run into what the options are about:

``plain``             the radix cache alone, no sessions, a small KV pool
``mamba``             a hybrid SSM model's mamba radix cache, no sessions, a 200-token
                      KV pool, 4 requests running at most, queued ones timing out after
                      4 steps
``sessions-retract``  streaming sessions, SGLang's own test switch retracting a
                      decode every 3 steps (``SGLANG_TEST_RETRACT``)
``sessions-pressure`` streaming sessions on a KV pool too small for the load:
                      retraction because memory ran out
``mamba-sessions``    a hybrid SSM model's mamba radix cache, streaming sessions,
                      a small KV pool
``mamba-priority``    the same with ``--enable-priority-scheduling`` and
                      ``--max-queued-requests 1``: arrivals of higher priority
                      evict queued requests

The release is activated (its modules, SGLang's environment with its strict
invariant checks, as the gate runs it) for as long as ``opened()`` lasts, and a fresh scheduler is built for every history. SGLang
builds a session turn's input itself, so the content check reads it from the
``Req`` (``origin_input_ids``); it has no cache-off engine here (the stand-in
model's tokens depend on the input alone), so equivalence is skipped, and
cache hits are not read (``hit_of``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from kvwatch.targets.driver.history_target import LoopHistoryTarget, Shape
from kvwatch.targets.sglang import loop_choice
from kvwatch.targets.sglang.cache_watch import KvEventWatch, recorder_of
from kvwatch.targets.sglang.loop import SchedulerLoop
from kvwatch.targets.sglang.loop_parts import LoopConfig, PoolConfig
from kvwatch.targets.sglang.probe import CacheProbe
from kvwatch.targets.sglang.recording import STRICT_INVARIANTS, environment

CONTEXT = 256  # the longest request: prompt and output
CHUNK = 64


def _pools(kv: int, mamba: bool = False) -> PoolConfig:
    return PoolConfig(
        kv_tokens=kv, req_slots=16, max_context_len=CONTEXT, mamba_slots=24 if mamba else None
    )


SETUPS: dict[str, LoopConfig] = {
    "plain": LoopConfig(pools=_pools(300), chunked_prefill_size=CHUNK),
    "mamba": LoopConfig(
        pools=_pools(200, mamba=True),
        chunked_prefill_size=CHUNK,
        waiting_timeout_steps=4,
        max_running_requests=4,
    ),
    "sessions-retract": LoopConfig(
        pools=_pools(1024), streaming=True, retract_every=3, chunked_prefill_size=CHUNK
    ),
    "sessions-pressure": LoopConfig(pools=_pools(300), streaming=True, chunked_prefill_size=CHUNK),
    # SGLang's default event loop (the others pass --disable-overlap-schedule): frees and
    # reuses land one step late, while the next batch is already scheduled
    "overlap": LoopConfig(pools=_pools(300), chunked_prefill_size=CHUNK, overlap=True),
    "sessions-overlap": LoopConfig(
        pools=_pools(300), streaming=True, chunked_prefill_size=CHUNK, overlap=True
    ),
    "mamba-sessions": LoopConfig(
        pools=_pools(300, mamba=True), streaming=True, chunked_prefill_size=CHUNK
    ),
    "mamba-priority": LoopConfig(
        pools=_pools(300, mamba=True),
        streaming=True,
        chunked_prefill_size=CHUNK,
        priority_scheduling=True,
        max_queued_requests=1,
    ),
}


class SglangHistoryTarget(LoopHistoryTarget):
    engine = "sglang"

    def __init__(self, version: str = "0.5.23", setup: str = "sessions-retract") -> None:
        if setup not in SETUPS:
            raise ValueError(f"no SGLang setup {setup!r}; setups: {', '.join(SETUPS)}")
        self.version, self.setup, self.config = version, setup, SETUPS[setup]
        self.release = loop_choice.load(version)  # Unavailable, Unsupported: not driven
        loop_choice.check(self.release, self.config)
        self.shape = Shape(
            engine=self.engine,
            page=self.config.pools.page_size,
            chunk=CHUNK,
            context=CONTEXT,
            unit=16,
            sessions=self.config.streaming,
            priorities=self.config.priority_scheduling,
        )

    @contextlib.contextmanager
    def opened(self) -> Iterator[None]:
        """The release active, with the gate's environment: SGLang's strict invariant
        checks on, its loggers quiet."""
        values = {**STRICT_INVARIANTS, **loop_choice.environment(self.release, self.config)}
        with self.release.active(), environment(values):
            yield

    def make_loop(self) -> SchedulerLoop:
        return loop_choice.make(self.release, self.config)

    def make_probe(self, loop: Any) -> CacheProbe:
        return CacheProbe(loop)

    def make_watch(self, loop: Any) -> KvEventWatch | None:
        recorder = recorder_of(loop)
        return KvEventWatch(loop, recorder) if recorder is not None else None

    def describe(self) -> dict[str, Any]:
        return {"engine": self.engine, "version": self.version, "setup": self.setup}
