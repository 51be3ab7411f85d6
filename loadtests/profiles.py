"""The load profiles: what each one runs, against which engine setup, and why.

A profile names its Locust user class (in ``agents.py``), the engine
overrides the gate serves it with (small pools, so pressure, pruning and
retraction happen within a few turns), and the faults it is there to expose.
``kvwatch profiles`` prints this table. Importing this module pulls in
neither Locust nor the engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

# The gate's engine: the reference model with pools small enough to feel pressure.
BASE_ENGINE: Mapping[str, Any] = {
    "cache": {
        "full_kv": {"capacity": 1024},
        "swa_kv": {"capacity": 256},
        "swa_window": {"capacity": 96, "host_capacity": 48},
        "linear_state": {"capacity": 96, "host_capacity": 48},
    },
    "scheduler": {
        "max_running": 16,
        "chunk_size": 48,
        "max_batch_tokens": 96,
        "spec": {"num_drafts": 6},
    },
}


class Profile(NamedTuple):
    name: str
    user: str  # the Locust user class in kvwatch.loadtests.agents
    summary: str
    faults: tuple[str, ...]  # what it is there to expose
    engine: Mapping[str, Any] = {}  # overrides on top of BASE_ENGINE
    kvwatch_api: bool = False  # needs kvwatch's session API (not for any OpenAI server)
    heap: bool = False  # tracemalloc samples at barriers
    flush_every_turn: bool = False

    def engine_config(self) -> dict:
        return _merge(BASE_ENGINE, self.engine)

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "user": self.user,
            "summary": self.summary,
            "faults": list(self.faults),
            "black_box": not self.kvwatch_api,
            "heap": self.heap,
            "flush_every_turn": self.flush_every_turn,
            "engine": self.engine_config(),
        }


def _merge(base: Mapping, extra: Mapping) -> dict:
    out = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in base.items()}
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "agentic-trie",
            "AgentTrieUser",
            "agents share a system prompt and tool schema, run multi-turn chats with parallel "
            "tool calls, and fork sub-agents from a chat's history",
            (
                "interior-snapshot-leak",
                "snapshot-release-ignores-host-refs",
                "history-only-anchor",
                "root-ref-leak-on-miss",
            ),
            # a retracted request waits 16 steps on the host tier: long enough for a
            # probe between two barriers to see what its host ref should protect
            engine={"scheduler": {"retract_every": 6, "retract_backoff": 16}},
        ),
        Profile(
            "streaming-session",
            "StreamingSessionUser",
            "two kept session slots per agent, streamed side by side with speculative "
            "decoding and retract-retry mid-verify; one first turn is cut mid-stream",
            ("spec-overalloc-leak", "session-tail-leak", "session-tail-unaligned-free"),
            engine={"scheduler": {"retract_every": 5}},
            kvwatch_api=True,
        ),
        Profile(
            "abort-storm",
            "AbortStormUser",
            "long prompts cut mid-prefill, streams cut mid-decode, stalled readers; the cache "
            "is flushed at every barrier",
            ("abort-state-buffer-leak", "root-in-evict-set"),
            flush_every_turn=True,
        ),
        Profile(
            "rl-rollout",
            "RolloutUser",
            "recorded sessions with routed experts, n sampled rollouts per prompt, rollback "
            "and a trajectory fetch every turn",
            ("session-blob-retention", "session-tail-leak"),
            kvwatch_api=True,
            heap=True,
        ),
        Profile(
            "slot-cache",
            "SlotCacheUser",
            "the seed-004 sequence on the snapshot-slot backend: follow-ups that shorten and "
            "lengthen, and tiny chats whose snapshots abort",
            ("stale-slot-entry",),
            engine={"cache": {"mode": "slots", "slots": 2}},
        ),
        Profile(
            "bad-input",
            "BadInputUser",
            "malformed requests (bad JSON, types, ranges, token ids, sessions) mixed with valid "
            "chats and cold prompts that miss the cache",
            ("root-ref-leak-on-miss",),
        ),
    )
}


def get(name: str) -> Profile:
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; profiles are {', '.join(PROFILES)}")
    return PROFILES[name]


def engine_for(names: tuple[str, ...]) -> dict:
    """One engine config for profiles run side by side: each one's overrides in turn."""
    config = dict(BASE_ENGINE)
    for name in names:
        config = _merge(config, get(name).engine)
    return config
