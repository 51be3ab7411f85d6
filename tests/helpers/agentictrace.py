"""A seeded agentic trace for the peer benchmark: long shared prefixes, turns,
parallel tool calls and sub-agents, in the order a server would see them.

Every agent starts from one shared system prompt (1-1.5k tokens) and one tool
schema (512 tokens), gets a task, and runs 6-10 turns (``turns``). Each round
every live agent sends its conversation so far plus a user turn; the reply is
appended to its history (replies are part of the trace, not generated)::

    [system][schema] task u1 r1 u2 r2 ...             an agent's turn
    [system][schema] task u1 r1 ... r2 result_i       parallel tool calls (2-4 siblings)
    [system][schema] task u1 r1   sub-task s1 ...     a sub-agent forked at an earlier turn

After a quarter of the turns the reply calls 2-4 tools at once: each result
goes out as a request of its own (siblings branching at the same point), then
all of them join the history. A sub-agent forks an agent's history as it stood
a few turns back and runs 2-4 turns of its own. The same seed gives the same
trace, token for token.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from benchtrace import Trace

VOCAB = 150_000  # token ids drawn from a tokenizer-sized range


@dataclass
class _Agent:
    history: list[int]
    turns_left: int
    past: list[int] = field(default_factory=list)  # history length after each turn
    forks: bool = True  # sub-agents do not fork sub-agents of their own


class _Draw:
    """The one random stream the whole trace is drawn from."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def tokens(self, lo: int, hi: int) -> list[int]:
        return [self.rng.randrange(VOCAB) for _ in range(self.rng.randint(lo, hi))]

    def chance(self, p: float) -> bool:
        return self.rng.random() < p


def _turn(draw: _Draw, agent: _Agent) -> list[tuple[int, ...]]:
    """One round of one agent: its prompt, any parallel tool calls, and the
    history they leave behind."""
    prompt = [*agent.history, *draw.tokens(50, 300)]
    sent = [tuple(prompt)]
    agent.history = [*prompt, *draw.tokens(100, 300)]
    if draw.chance(0.25):
        results = [draw.tokens(50, 300) for _ in range(draw.rng.randint(2, 4))]
        sent += [(*agent.history, *r) for r in results]
        agent.history += [t for r in results for t in r]
    agent.past.append(len(agent.history))
    agent.turns_left -= 1
    return sent


def _fork(draw: _Draw, agent: _Agent) -> _Agent:
    """A sub-agent that starts from ``agent``'s history a few turns back."""
    depth = draw.rng.choice(agent.past[-4:])
    history = [*agent.history[:depth], *draw.tokens(100, 300)]
    return _Agent(history, draw.rng.randint(2, 4), forks=False)


def agentic_trace(agents: int = 8, turns: tuple[int, int] = (6, 10), seed: int = 0) -> Trace:
    """``agents`` agents of ``turns`` turns each (inclusive range), round by round."""
    draw = _Draw(seed)
    system = draw.tokens(1000, 1500)
    schema = draw.tokens(512, 512)
    live = [
        _Agent([*system, *schema, *draw.tokens(100, 300)], draw.rng.randint(*turns))
        for _ in range(agents)
    ]
    rounds = []
    while live:
        sent: list[tuple[int, ...]] = []
        born = []
        for agent in live:
            sent += _turn(draw, agent)
            if agent.forks and len(agent.past) > 1 and draw.chance(0.15):
                born.append(_fork(draw, agent))
        live = [a for a in live if a.turns_left > 0] + born
        rounds.append(tuple(sent))
    return Trace(tuple(rounds))
