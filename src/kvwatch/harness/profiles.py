"""The load profiles: what each one runs, against which engine setup, and why.

A profile names its Locust user class (in ``agents.py``) and the engine
overrides the gate serves it with (small pools, so pressure, pruning and
retraction happen within a few turns). Which fault each profile is there to
expose, and which detector must catch it, is the gate's
(``gate/verdicts/catches.py``): the load knows no detector. ``kvwatch
profiles`` prints the profiles with their faults. Importing this module pulls
in neither Locust nor the engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

# The gate's engine: the reference model with pools small enough to feel pressure,
# and failpoints (engine/cache/failpoints.py): every allocation site fails one of
# its first 8 hits and about one hit in 32-64 after, so a run takes the cache's
# failure paths whatever the load; the gate seeds them with its --seed and arms
# them in runs at c >= 2 (targets/kvwatch/target.py; c = 1 runs the load as written). (Failing
# the first or second hit, the first turns of a small profile were all refusals:
# no answer before the warm-up's end, so its series and heap had no level.)
BASE_ENGINE: Mapping[str, Any] = {
    "cache": {
        "full_kv": {"capacity": 1024},
        "swa_kv": {"capacity": 256},
        "swa_window": {"capacity": 96, "host_capacity": 48},
        "linear_state": {"capacity": 96, "host_capacity": 48},
        "failpoints": {"seed": 0, "first": 8, "every": 32},
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
    # the Locust user class in kvwatch.loadtests.agents (several side by side: a soak)
    user: str | tuple[str, ...]
    summary: str
    engine: Mapping[str, Any] = {}  # overrides on top of BASE_ENGINE
    kvwatch_api: bool = False  # needs kvwatch's session API (not for any OpenAI server)
    heap: bool = False  # heap samples at every concurrency (else up to HEAP_UP_TO, targets/kvwatch/target.py)
    flush_every_turn: bool = False
    serve_flags: tuple[str, ...] = ()  # kvwatch serve options the profile needs
    # turns per run unless --turns says otherwise: a warm-up of 2 leaves 4 judged
    # turns, the fewest a trend test can call rising, and only in perfect order
    turns: int = 6

    def engine_config(self) -> dict:
        return merge(BASE_ENGINE, self.engine)

    def as_dict(self, faults: Sequence[str] = ()) -> dict:
        """The profile as ``kvwatch profiles --json`` lists it, with ``faults``, the
        faults it is there to expose (the gate knows them: ``catches.exposed_by``)."""
        return {
            "name": self.name,
            "user": self.user,
            "summary": self.summary,
            "faults": list(faults),
            "black_box": not self.kvwatch_api,
            "heap": self.heap,
            "flush_every_turn": self.flush_every_turn,
            "turns": self.turns,
            "serve_flags": list(self.serve_flags),
            "engine": self.engine_config(),
        }


def merge(base: Mapping, extra: Mapping) -> dict:
    """``base`` with ``extra``'s keys on top, mappings merged key by key."""
    out = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in base.items()}
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            name="agentic-trie",
            user="AgentTrieUser",
            summary="agents share a system prompt and tool schema, run multi-turn chats with parallel "
            "tool calls, and fork sub-agents from a chat's history",
            # a retracted request waits 16 steps on the host tier: long enough for a
            # probe between two barriers to see what its host ref should protect
            engine={"scheduler": {"retract_every": 6, "retract_backoff": 16}},
        ),
        Profile(
            name="streaming-session",
            user="StreamingSessionUser",
            summary="two kept session slots per agent, streamed side by side with speculative "
            "decoding and retract-retry mid-verify; one first turn is cut mid-stream",
            engine={"scheduler": {"retract_every": 5}},
            kvwatch_api=True,
        ),
        Profile(
            name="abort-storm",
            user="AbortStormUser",
            summary="long prompts cut mid-prefill, streams cut mid-decode, stalled readers; the cache "
            "is flushed at every barrier",
            flush_every_turn=True,
        ),
        Profile(
            name="rl-rollout",
            user="RolloutUser",
            summary="recorded sessions with routed experts, n sampled rollouts per prompt, rollback "
            "and a trajectory fetch every turn",
            kvwatch_api=True,
            heap=True,
            # its leak is judged on the heap alone, per held token: 6 judged turns
            # still call a rise when the cached prompts' pages jump once
            turns=8,
        ),
        Profile(
            name="slot-cache",
            user="SlotCacheUser",
            summary="the seed-004 sequence on the snapshot-slot backend: follow-ups that shorten and "
            "lengthen, retried follow-ups, and tiny chats whose snapshots abort",
            # a full.kv pool that a few running requests and two slots overfill:
            # slots are evicted under pressure
            engine={"cache": {"mode": "slots", "slots": 2, "full_kv": {"capacity": 128}}},
        ),
        Profile(
            name="chaos",
            user="ChaosUser",
            summary="session and request transitions the other profiles leave out, mixed from the "
            "seed: sessions opened and closed at once, closed after a cut turn or a rollback, "
            "left to the idle timeout; requests aborted while retracted, recovering or "
            "paused, or paused and resumed",
            kvwatch_api=True,
            # its aborted retractions leave host-tier cache each turn: flushed at the
            # barrier, so usage gauges show what is held, not what is cached
            flush_every_turn=True,
            serve_flags=("--session-idle-timeout", "5"),  # chaos.IDLE_TIMEOUT_S
            # state pools that a few users' requests fill: admissions meet a full
            # pool while they hold a matched prefix, and must give it back
            engine={"cache": {"swa_window": {"capacity": 16}, "linear_state": {"capacity": 16}}},
        ),
        Profile(
            name="edges",
            user="EdgeUser",
            summary="the combinations and page boundaries the other profiles leave to chance, "
            "each on purpose: siblings branching at every offset of a page and a window, prompt "
            "ends around page edges, retraction and recovery on one path, a session turn cut at "
            "every stage, closes and rollbacks refused while a turn runs, idle timeouts",
            kvwatch_api=True,
            serve_flags=("--session-idle-timeout", "4"),  # edges.IDLE_TIMEOUT_S
            # a full.kv pool that a turn's trunks, siblings and long prompts overfill:
            # leaves on the shared path are evicted while others on it are in flight;
            # a host tier of 4 snapshots, which its retractions fill with cache, so an
            # offload takes cache back from the host (host snapshot: host -> pruned)
            engine={
                "cache": {
                    "full_kv": {"capacity": 640},
                    "swa_window": {"host_capacity": 4},
                    "linear_state": {"host_capacity": 4},
                }
            },
        ),
        Profile(
            name="bad-input",
            user="BadInputUser",
            summary="malformed requests (bad JSON, types, ranges, token ids, sessions) mixed with valid "
            "chats and cold prompts that miss the cache",
        ),
    )
}


def openai_only() -> dict[str, Profile]:
    """The profiles that speak only the OpenAI API: what any server can run."""
    return {name: p for name, p in PROFILES.items() if not p.kvwatch_api}


def get(name: str) -> Profile:
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; profiles are {', '.join(PROFILES)}")
    return PROFILES[name]


def engine_for(names: tuple[str, ...]) -> dict:
    """One engine config for profiles run side by side: each one's overrides in turn."""
    config = dict(BASE_ENGINE)
    for name in names:
        config = merge(config, get(name).engine)
    return config


# what ``kvwatch gate --soak`` runs side by side by default, on one engine
SOAK_PROFILES = ("agentic-trie", "streaming-session")


def soak_profile(names: tuple[str, ...] = SOAK_PROFILES) -> Profile:
    """One server for a soak's profiles side by side: their users together, their
    engine overrides merged; ValueError for a profile a soak cannot run."""
    for name in names:
        get(name)
        if name not in SOAK_PROFILES:
            raise ValueError(f"--soak runs {' and '.join(SOAK_PROFILES)}, not {name!r}")
    users = tuple(get(n).user for n in names)
    return Profile(
        name="soak",
        user=users,
        summary=f"{' and '.join(users)}, free-running",
        engine=engine_for(names),
    )
