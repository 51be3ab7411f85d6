"""Seed 000: superseded interior continuation snapshots exhaust the State pool.

Eight agents share a system prompt and keep their multi-turn paths locked for
50 turns, as in the report's c=8 agentic-trie run. Every turn also starts a
fresh sub-agent prefill. The State pools are small on purpose.
"""

from __future__ import annotations

import itertools
import random

from cachesim import INT_LAYOUTS, SimRunner, cache_config, run_turn

from kvwatch.engine.cache.audit import audit
from kvwatch.engine.cache.backends import build_cache
from kvwatch.engine.cache.base import CacheBase
from kvwatch.engine.cache.pool import PoolExhausted
from kvwatch.engine.cache.usage import SNAPSHOTS_PER_HOLDER, usage_bounds
from kvwatch.engine.config import (
    LINEAR_STATE,
    STATE_GROUPS,
)
from kvwatch.engine.faults import Fault

HOLDERS, TURNS = 8, 50
CONFIG = cache_config(window=32, interval=64, page=16, full=8192, swa=256, snapshots=96)


class Outcome:
    def __init__(self) -> None:
        self.state_pages: list[int] = []  # linear.state pages pinned after each turn
        self.exceeded_at: int | None = None
        self.error: PoolExhausted | None = None
        self.turns_done = 0


def agentic_trie(faults: frozenset[Fault]) -> tuple[CacheBase, Outcome]:
    rng = random.Random(0)
    cache = build_cache(CONFIG, INT_LAYOUTS, faults=faults)
    sim = SimRunner(cache)
    system = [rng.randrange(50) for _ in range(96)]
    seeder = cache.open([*system, 0])
    cache.match(seeder)
    run_turn(sim, seeder, [], chunk=32, decode=[])
    cache.release(seeder, commit=True)

    agents = []
    for a in range(HOLDERS):
        agent = cache.open([*system, 100 + a])
        assert cache.match(agent).resume_len == len(system)
        agents.append(agent)
    out = Outcome()
    for turn in range(TURNS):
        try:
            for agent in agents:
                user = [rng.randrange(50) for _ in range(rng.randrange(20, 40))]
                run_turn(sim, agent, user, chunk=32, decode=[rng.randrange(50) for _ in range(8)])
            fresh = cache.open(system + [rng.randrange(50) for _ in range(40)])
            cache.match(fresh)
            run_turn(sim, fresh, [], chunk=32, decode=[])
            cache.release(fresh, commit=True)
        except PoolExhausted as exc:
            out.error = exc
            break
        bounds = usage_bounds(cache.view)
        out.state_pages.append(bounds[LINEAR_STATE].pinned)
        if out.exceeded_at is None and any(bounds[g].exceeded for g in STATE_GROUPS):
            out.exceeded_at = turn
        out.turns_done = turn + 1
    return cache, out


def report(label: str, out: Outcome) -> None:
    """The report's figures at small scale: p50 and peak of the State pool."""
    series = sorted(out.state_pages)
    p50, peak = series[len(series) // 2], series[-1]
    print(
        f"\nseed000 {label}: {LINEAR_STATE} p50 {p50} peak {peak} of "
        f"{CONFIG.linear_state.capacity} after {out.turns_done} turns"
    )


def test_clean_engine_keeps_state_per_holder_constant():
    cache, out = agentic_trie(frozenset())
    report("fixed", out)
    assert out.error is None and out.turns_done == TURNS
    assert out.exceeded_at is None
    # Each agent pins its working state plus at most SNAPSHOTS_PER_HOLDER snapshots,
    # whatever the turn: the series is flat after the first turn.
    assert max(out.state_pages) <= HOLDERS * (1 + SNAPSHOTS_PER_HOLDER)
    assert out.state_pages[-1] == out.state_pages[1]
    assert audit(cache.view).clean


def test_interior_snapshot_leak_grows_every_turn_until_allocation_fails():
    cache, out = agentic_trie(frozenset({Fault.INTERIOR_SNAPSHOT_LEAK}))
    report("leaking", out)
    series = out.state_pages
    assert len(series) >= 2 and all(b > a for a, b in itertools.pairwise(series)), series
    assert out.exceeded_at is not None and out.exceeded_at <= 2
    # The pool runs dry long before turn 50, and the fresh prefill fails with a
    # clean, typed error naming the State group; the cache itself stays sound.
    assert isinstance(out.error, PoolExhausted), "expected the State pool to run out"
    assert out.error.group in STATE_GROUPS
    assert "out of pages" in str(out.error)
    assert out.turns_done < 10
    assert audit(cache.view).clean
