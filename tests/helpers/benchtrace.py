"""A fixed agentic-trie trace for benchmarks, and what an ideal cache would compute.

Agents share a system prompt and a tool schema. Each round every agent sends
its conversation so far plus a new user message, and fires one tool call over
the schema; from round 1 a sub-agent forks a conversation where it stood a
round before. Replies are part of the trace (not the model's output), so the
prompts, and the number of unique tokens in them, are known in advance::

    [system][schema] u1 a1 u2 a2 ...      agent i, round r
    [system][schema] tool-call            agent i, round r
    [system][schema] u1 a1 ...  u'        sub-agent forked at round r - 1
"""

from __future__ import annotations

import random
from typing import NamedTuple

from kvwatch.engine.model.tokenizer import ASSISTANT, BOS, END, SYSTEM, TOOL, USER


class Trace(NamedTuple):
    rounds: tuple[tuple[tuple[int, ...], ...], ...]  # the prompts sent in each round

    @property
    def prompts(self) -> list[tuple[int, ...]]:
        return [p for r in self.rounds for p in r]

    def unique_tokens(self) -> int:
        """Distinct prefixes over every prompt: the tokens an ideal cache computes once."""
        seen: set[tuple[int, ...]] = set()
        count = 0
        for prompt in self.prompts:
            for end in range(len(prompt), 0, -1):
                if prompt[:end] in seen:
                    break
                seen.add(prompt[:end])
                count += 1
        return count

    def page_aligned_tokens(self, page: int) -> int:
        """What an ideal cache that resumes only at page boundaries computes: each
        prompt from the last page boundary inside the prefix it shares with an
        earlier prompt (and always its last token). No cache whose state lives on
        page-aligned tree nodes can do better."""
        seen: set[tuple[int, ...]] = set()
        count = 0
        for prompt in self.prompts:
            shared = next((end for end in range(len(prompt), 0, -1) if prompt[:end] in seen), 0)
            resume = min(shared, len(prompt) - 1) // page * page
            count += len(prompt) - resume
            seen.update(prompt[:end] for end in range(shared + 1, len(prompt) + 1))
        return count

    def total_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)


def agentic_trace(agents: int = 8, rounds: int = 6, seed: int = 0) -> Trace:
    rng = random.Random(seed)

    def words(lo: int, hi: int) -> list[int]:
        return [rng.randrange(32, 127) for _ in range(rng.randint(lo, hi))]

    system = [BOS, SYSTEM, *words(300, 300), END]
    schema = [TOOL, *words(200, 200), END]
    base = system + schema
    histories = [list(base) for _ in range(agents)]
    out = []
    for r in range(rounds):
        sent = []
        previous = [list(h) for h in histories]
        for i in range(agents):
            prompt = [*histories[i], USER, *words(20, 60), END, ASSISTANT]
            sent.append(tuple(prompt))
            histories[i] = [*prompt, *words(20, 80), END]
            sent.append((*base, USER, *words(10, 30), END, ASSISTANT))  # a tool call
        if r > 0:
            fork = [*previous[rng.randrange(agents)], USER, *words(20, 60), END, ASSISTANT]
            sent.append(tuple(fork))
        out.append(tuple(sent))
    return Trace(tuple(out))
