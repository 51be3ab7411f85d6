"""Seeded in-process workloads: what c agents do in one turn, against an ``Engine``.

* ``agentic``: agents share a system prompt and a tool schema; each turn
  every agent extends its own conversation (committed to the tree), takes a
  turn in its recorded streaming session (speculative decoding, routed
  experts), and fires two tool calls over the schema, one of which is
  aborted or paused mid-prefill; every other turn a long tool result is
  pushed out by pool pressure once it has committed state of its own, and
  its client sends it again (a retry). A sub-agent branches each turn from where a
  conversation stood two turns before (its prompt runs through turn-end
  nodes whose superseded state was released); the oldest sub-agent retires
  once there are ``max_conversations``.
* ``churn``: conversations plus cold prompts that miss the tree; the cache is
  flushed at every barrier, as an engine under memory churn empties it.
* ``slot-cache``: the snapshot-slot backend; agents run conversations whose
  follow-ups shorten and lengthen, with tiny chats whose snapshots abort.

A workload only submits requests and knows its conversations; the harness
steps the engine and records probes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from kvwatch.engine import Engine, EngineConfig, SamplingParams, SchedulerConfig, SpecConfig
from kvwatch.engine.config import CacheConfig, PrefixCacheMode
from kvwatch.engine.model.tokenizer import ASSISTANT, BOS, END, SYSTEM, TOOL, USER

PARAMS = SamplingParams(max_tokens=8)
SESSION_PARAMS = SamplingParams(max_tokens=16)
FIRST_SESSION_PARAMS = SamplingParams(max_tokens=48)
WORKLOADS = ("agentic", "churn", "slot-cache")


def engine_config(workload: str, faults: frozenset = frozenset()) -> EngineConfig:
    """Small pools, so pressure, pruning and retraction happen within a few turns."""
    base = CacheConfig()
    cache = replace(
        base,
        full_kv=replace(base.full_kv, capacity=1024),
        swa_kv=replace(base.swa_kv, capacity=256),
        swa_window=replace(base.swa_window, capacity=96, host_capacity=48),
        linear_state=replace(base.linear_state, capacity=96, host_capacity=48),
        mode=PrefixCacheMode.SLOTS if workload == "slot-cache" else PrefixCacheMode.RADIX,
        slots=2,
    )
    # Two prefill chunks fill a step, so a request pushed out waits while others go on.
    sched = SchedulerConfig(
        max_running=16, chunk_size=48, max_batch_tokens=96, spec=SpecConfig(num_drafts=6)
    )
    return EngineConfig(cache=cache, scheduler=sched, faults=faults)


class Submitted(NamedTuple):
    """One turn's requests, as the harness must treat them."""

    keep: list[tuple[str, int]]  # (request id, conversation index): outputs extend it
    cut: list[str]  # tool calls to abort or pause mid-prefill
    retry: list[tuple[str, list[int]]]  # (request id, prompt): push out, then send again


@dataclass
class Workload:
    name: str
    agents: int
    seed: int = 0
    warmup: int = 2
    rng: random.Random = field(init=False)
    histories: list[list[int]] = field(default_factory=list)
    past: list[list[list[int]]] = field(default_factory=list)
    schema: list[int] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.name not in WORKLOADS:
            raise ValueError(
                f"unknown workload {self.name!r}; workloads are {', '.join(WORKLOADS)}"
            )
        self.rng = random.Random(self.seed)
        system = [BOS, SYSTEM, *self.words(70), END]
        self.schema = [*system, TOOL, *self.words(90), END]
        self.histories = [list(system) for _ in range(self.agents)]
        self.past = [[list(system)] for _ in range(self.agents)]  # the last two histories

    def words(self, n: int) -> list[int]:
        return [self.rng.randrange(32, 127) for _ in range(n)]

    def message(self, lo: int = 12, hi: int = 40) -> list[int]:
        return [USER, *self.words(self.rng.randint(lo, hi)), END, ASSISTANT]

    # -- a turn -----------------------------------------------------------------------
    def start(self, engine: Engine) -> None:
        if self.name == "agentic":
            self.sessions = [
                engine.open_session(record=True, routed_experts=True) for _ in range(self.agents)
            ]

    def submit(self, engine: Engine, turn: int) -> Submitted:
        """Queue this turn's requests (see ``Submitted``)."""
        keep, cut, retry = [], [], []
        if self.name == "agentic" and turn > 0:
            # a sub-agent branches from where a conversation stood two turns ago; past
            # the cap, the oldest sub-agent's conversation ends to make room
            if len(self.histories) >= self.max_conversations:
                del self.histories[self.agents], self.past[self.agents]
            source = self.rng.randrange(self.agents)
            self.histories.append(list(self.past[source][0]))
            self.past.append([self.histories[-1]])
        for i, history in enumerate(self.histories):
            self.past[i] = [*self.past[i][-1:], list(history)]
            keep.append((engine.add_request(self._prompt(history, turn), PARAMS), i))
        if self.name == "agentic":
            for sid in self.sessions:
                tokens = engine.sessions.get(sid).tokens
                close = [END] if tokens and tokens[-1] != END else []
                prompt = [*tokens, *close, *(self.message() if tokens else [BOS, *self.message()])]
                # the first turn runs long: many verify steps, many chances to be cut
                params = SESSION_PARAMS if turn else FIRST_SESSION_PARAMS
                engine.add_request(prompt, params, session_id=sid)
            # parallel tool calls over the shared schema: at least two run side by side
            for _ in range(max(2, self.agents // 2)):
                engine.add_request([*self.schema, *self.message(4, 12)], PARAMS)
            for _ in range(max(1, self.agents // 2)):
                cut.append(engine.add_request([*self.schema, *self.words(120)], PARAMS))
            if turn % 2 == 0:
                # a long tool result that pressure pushes out and its client sends
                # again: the retry commits through the node the first recovers from
                # (the host-ref case of seed 000)
                result = [*self.schema, TOOL, *self.words(150), END, ASSISTANT]
                retry.append((engine.add_request(result, PARAMS), result))
        if self.name == "churn":
            for _ in range(max(1, self.agents // 2)):
                engine.add_request(self.words(self.rng.randint(20, 90)), PARAMS)  # misses
        return Submitted(keep, cut, retry)

    def _prompt(self, history: list[int], turn: int) -> list[int]:
        if self.name != "slot-cache":
            return [*history, *self.message()]
        # follow-ups that shorten and lengthen the last message, and tiny chats
        # whose degenerate boundary burns a slot step
        if self.rng.random() < 0.3:
            return [BOS, USER, *self.words(3), END, ASSISTANT]
        lo, hi = (4, 10) if self.rng.random() < 0.5 else (60, 140)
        return [*history, *self.message(lo, hi)]

    def finished(self, conversation: int, prompt: list[int], output: list[int]) -> None:
        if self.name == "slot-cache" and prompt[:2] == [BOS, USER] and len(prompt) < 12:
            return  # a tiny chat is not part of any conversation
        self.histories[conversation] = [*prompt, *output]

    @property
    def max_conversations(self) -> int:
        """Agents plus up to three sub-agents (one per agent at c = 1 and 2)."""
        return self.agents + min(3, self.agents)

    @property
    def conversations(self) -> int:
        return len(self.histories) + len(self.sessions)

    def context_tokens(self, engine: Engine) -> int:
        live = sum(len(engine.sessions.get(s).tokens) for s in self.sessions)
        return live + sum(len(h) for h in self.histories)

    def stop(self, engine: Engine) -> None:
        for sid in self.sessions:
            engine.close_session(sid)
        self.sessions = []

    @property
    def flush_every_turn(self) -> bool:
        return self.name == "churn"
