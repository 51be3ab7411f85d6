"""The equivalence replay: a run's greedy requests again, on a cache-off engine.

The reference is an engine of the same model with the prefix cache off, one
request at a time, in this process: what the served engine must have
produced if its cache did nothing wrong. Outputs are exactly reproducible
(float64 on CPU), so any difference is silent corruption. The same replay
serves runs recorded in process and over HTTP; the served engine itself is
never asked, so a corrupted cache cannot vouch for itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from kvwatch.engine import Engine, EngineConfig, SamplingParams, SchedulerConfig
from kvwatch.engine.config import PrefixCacheMode
from kvwatch.instrumentation.record import Candidate, Replay

REFERENCE_TOKENS = 4096  # one prompt at a time, in one chunk


def reference_engine(config: EngineConfig) -> Engine:
    """``config``'s model with the cache off, room for one long request, no faults."""
    cache = replace(
        config.cache,
        mode=PrefixCacheMode.OFF,
        full_kv=replace(
            config.cache.full_kv, capacity=max(config.cache.full_kv.capacity, REFERENCE_TOKENS)
        ),
    )
    scheduler = SchedulerConfig(
        max_running=1, chunk_size=REFERENCE_TOKENS, max_batch_tokens=REFERENCE_TOKENS
    )
    return Engine(
        EngineConfig(model=config.model, cache=cache, scheduler=scheduler, device=config.device)
    )


class Reference:
    """The reference engine for one served config, built on first use and reused."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._engine: Engine | None = None

    def replay(self, candidates: Sequence[Candidate]) -> tuple[Replay, ...]:
        """Each candidate's prompt, greedy, on the reference engine."""
        if not candidates:
            return ()
        if self._engine is None:
            self._engine = reference_engine(self.config)
        out = []
        for c in candidates:
            params = SamplingParams(max_tokens=c.max_tokens, temperature=0.0)
            reference = self._engine.generate([list(c.prompt)], params)[0].token_ids
            out.append(Replay(c.turn, c.prompt, c.output, tuple(reference)))
        return tuple(out)
