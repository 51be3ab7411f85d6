"""The equivalence replay: a run's comparable requests again, on a cache-off engine.

The reference is an engine of the same model with the prefix cache off, in
this process: what the served engine must have produced if its cache did
nothing wrong. A comparable request is greedy, or sampled with a seed (each
request samples from a generator of its own, so batching does not change its
draws). The model is batch-invariant and outputs are exactly reproducible
(float64 on CPU), so the reference runs many requests at once and any
difference is silent corruption. The same replay serves runs recorded in
process and over HTTP; the served engine itself is never asked, so a
corrupted cache cannot vouch for itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from kvwatch.engine import Engine, EngineConfig, SamplingParams, SchedulerConfig
from kvwatch.engine.config import PrefixCacheMode
from kvwatch.harness.run_record import Candidate, Replay

REFERENCE_TOKENS = 4096  # a whole prompt in one chunk
REFERENCE_BATCH = 16  # requests run side by side


def reference_engine(config: EngineConfig) -> Engine:
    """``config``'s model with the cache off, room for a batch of long requests, no
    faults and no failpoints."""
    room = REFERENCE_BATCH * REFERENCE_TOKENS // config.cache.page_size
    cache = replace(
        config.cache,
        mode=PrefixCacheMode.OFF,
        failpoints=None,
        full_kv=replace(config.cache.full_kv, capacity=max(config.cache.full_kv.capacity, room)),
    )
    scheduler = SchedulerConfig(
        max_running=REFERENCE_BATCH, chunk_size=REFERENCE_TOKENS, max_batch_tokens=REFERENCE_TOKENS
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
        """Each candidate's prompt with its own parameters on the reference engine."""
        if not candidates:
            return ()
        if self._engine is None:
            self._engine = reference_engine(self.config)
        engine = self._engine
        ids = [engine.add_request(list(c.prompt), _params(c)) for c in candidates]
        while engine.has_unfinished():
            engine.step()
        return tuple(
            Replay(
                turn=c.turn,
                prompt=c.prompt,
                cached=c.output,
                reference=tuple(engine.take(rid).token_ids),
            )
            for c, rid in zip(candidates, ids, strict=True)
        )


def _params(c: Candidate) -> SamplingParams:
    return SamplingParams(
        max_tokens=c.max_tokens,
        temperature=c.temperature,
        top_p=c.top_p,
        seed=c.seed,
        stop_token_ids=c.stop_token_ids,
        ignore_eos=c.ignore_eos,
    )


def spread(items: list, most: int | None) -> list:
    """All of ``items``, or ``most`` of them evenly spread (first and last kept)."""
    if most is None or len(items) <= most:
        return list(items)
    if most == 1:
        return [items[-1]]
    step = (len(items) - 1) / (most - 1)
    return [items[round(i * step)] for i in range(most)]
