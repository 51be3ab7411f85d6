"""Conversation tries for engine tests, and the cache-off oracle they are judged by.

A trie is a shared system prompt, several conversations that run turns on
it, and sub-agents that fork a conversation's history at some turn. Every
turn's prompt is the conversation so far plus a new user message, rendered
with the chat template's turn markers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import lru_cache

from kvwatch.engine import CacheConfig, Engine, EngineConfig, SamplingParams, SchedulerConfig
from kvwatch.engine.config import PrefixCacheMode
from kvwatch.engine.model.tokenizer import ASSISTANT, BOS, END, SYSTEM, USER
from kvwatch.engine.request import Status

PARAMS = SamplingParams(max_tokens=16)


def small_cache(
    full: int = 512, swa: int = 128, state: int = 48, host: int = 24, **kw
) -> CacheConfig:
    return CacheConfig.sized(full, swa, state, host, **kw)


@lru_cache(maxsize=1)
def _oracle_engine() -> Engine:
    config = EngineConfig(
        cache=small_cache(full=1024, mode=PrefixCacheMode.OFF),
        scheduler=SchedulerConfig(max_running=1, chunk_size=4096, max_batch_tokens=4096),
    )
    return Engine(config)


@lru_cache(maxsize=4096)
def _oracle(prompt: tuple[int, ...], params: SamplingParams) -> tuple[int, ...]:
    return tuple(_oracle_engine().generate([list(prompt)], params)[0].token_ids)


def oracle(prompt: list[int], params: SamplingParams = PARAMS) -> list[int]:
    """Greedy output of a cache-off engine running this one request alone."""
    return list(_oracle(tuple(prompt), params))


@dataclass
class Trie:
    seed: int
    conversations: int = 4
    turns: int = 3
    forks: int = 2
    system_len: int = 90
    user_len: tuple[int, int] = (8, 40)
    histories: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        system = [BOS, SYSTEM, *self._words(self.system_len), END]
        self.histories = [list(system) for _ in range(self.conversations)]

    def _words(self, n: int) -> list[int]:
        return [self.rng.randrange(32, 127) for _ in range(n)]

    def next_prompts(self, turn: int) -> list[list[int]]:
        """Each conversation's next prompt; sub-agents fork before some turns."""
        if turn > 0 and self.forks and self.rng.random() < 0.7:
            self.forks -= 1
            self.histories.append(list(self.rng.choice(self.histories)))
        return [
            [*h, USER, *self._words(self.rng.randint(*self.user_len)), END, ASSISTANT]
            for h in self.histories
        ]


@dataclass(frozen=True)
class Chaos:
    """What happens to the engine while the turns run."""

    retract_every: int = 0  # force-retract a running request every N steps
    noise: int = 0  # requests per turn that are aborted at a random step
    seed: int = 0


def run_trie(
    engine: Engine, trie: Trie, chaos: Chaos | None = None, params: SamplingParams = PARAMS
):
    """Run every turn of ``trie``; returns (prompt, output) of each finished request."""
    chaos = chaos or Chaos()
    rng = random.Random(chaos.seed)
    results = []
    for turn in range(trie.turns):
        prompts = trie.next_prompts(turn)
        ids = [engine.add_request(p, params) for p in prompts]
        noise = [
            engine.add_request(trie._words(rng.randint(20, 120)), params)
            for _ in range(chaos.noise)
        ]
        doomed = set(noise)
        while engine.has_unfinished():
            for rid in sorted(doomed):
                if rng.random() < 0.25:  # an abort at whatever stage the request is in now
                    engine.abort(rid)
                    doomed.discard(rid)
            if chaos.retract_every and engine.step_count % chaos.retract_every == 0:
                running = engine.request_ids(Status.RUNNING)
                if len(running) > 1:  # as pressure would: a request alone is never pushed out
                    engine.retract(rng.choice(running))
            engine.step()
        for rid in noise:
            engine.take(rid)
        for i, rid in enumerate(ids):
            done = engine.take(rid)
            assert done.error is None, done.error
            results.append((prompts[i], done.token_ids))
            trie.histories[i] = prompts[i] + done.token_ids
    return results
