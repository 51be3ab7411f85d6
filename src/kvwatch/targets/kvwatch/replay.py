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


def choose(candidates: list[Candidate], most: int | None) -> list[Candidate]:
    """The requests to replay: all of them, or ``most``, those that exercised
    something first (``Candidate.marks``: resumed at a boundary, retracted,
    recovered, paused), then the rest evenly spread, in the run's order.

    Marked requests are taken a mark at a time, the rarest mark first, each
    mark's requests evenly spread, so a small budget still reaches every kind
    of boundary the run crossed rather than the most frequent one only.
    """
    if most is None or len(candidates) <= most:
        return list(candidates)
    by_mark: dict[str, list[int]] = {}
    for i, c in enumerate(candidates):
        for mark in c.marks:
            by_mark.setdefault(mark, []).append(i)
    # the rarest mark first; within a mark, any first few taken lie across the run
    queues = [spread_order(ids) for ids in sorted(by_mark.values(), key=len)]
    taken: dict[int, None] = {}  # in the order taken
    while len(taken) < most and any(queues):
        for queue in queues:
            while queue and queue[0] in taken:
                queue.pop(0)
            if queue and len(taken) < most:
                taken[queue.pop(0)] = None
    rest = [i for i in range(len(candidates)) if i not in taken]
    picked = [*taken, *spread(rest, most - len(taken))]
    return [candidates[i] for i in sorted(picked)]


def spread_order(items: list) -> list:
    """``items`` reordered so that every prefix is evenly spread over them: the
    last, then the first, then the middle, then the quarters, ..."""
    out: dict = {}
    most = 1
    while len(out) < len(items):
        out.update(dict.fromkeys(spread(items, min(most, len(items)))))
        most *= 2
    return list(out)
