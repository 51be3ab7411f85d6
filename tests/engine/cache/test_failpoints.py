"""Failpoints: every allocation site of the cache fails on purpose, and every oracle holds.

The schedule (k, then every N-th hit) is deterministic from its seed; a site
fails the way a full pool fails there, holding nothing new; every site is
named at its allocation and fires in a short run; with failpoints on the
engine stays clean, equivalent to cache-off or failing cleanly, and drains
to empty; with them off nothing fires and nothing changes.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import itertools

import pytest
from cachesim import INT_LAYOUTS, cache_config
from conversations import oracle, small_cache
from failpointsim import FailpointRun, Outcome, Workload, varied
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paths import PACKAGE as ROOT

from kvwatch.engine import Engine, EngineConfig, SamplingParams, events
from kvwatch.engine.cache.failpoints import SITES, Failpoints, Site, schedule
from kvwatch.engine.cache.owner import Owner, OwnerKind
from kvwatch.engine.cache.pool import PoolExhausted
from kvwatch.engine.cache.storage import CacheStorage, FailpointExhausted
from kvwatch.engine.config import (
    FULL_KV,
    LINEAR_STATE,
    SWA_KV,
    FailpointConfig,
    PrefixCacheMode,
)
from kvwatch.engine.events import EventBus, FailpointFired, NodeEvicted, SnapshotReleased
from kvwatch.engine.overrides import apply_overrides
from kvwatch.serve import ServeOptions, engine_config

RADIX, SLOTS = PrefixCacheMode.RADIX, PrefixCacheMode.SLOTS
SLOT_ONLY = {Site.SLOT_RESTORE, Site.SLOT_STAGE}
# what each backend can reach: a slots cache has no tree, no host tier and no
# snapshots but its staged copies (its sessions keep none)
MODE_SITES = {
    RADIX: set(Site) - SLOT_ONLY,
    SLOTS: SLOT_ONLY
    | {Site.ADMIT_WORKING, Site.ALLOCATE_PREFILL, Site.ALLOCATE_DECODE, Site.ALLOCATE_DRAFTS},
}


# -- the schedule ------------------------------------------------------------------------
def firings(fp: Failpoints, site: Site, hits: int) -> list[int]:
    return [h for h in range(1, hits + 1) if fp.fires(site, FULL_KV)]


def test_a_site_fails_its_hit_k_then_every_nth_hit_after():
    config = FailpointConfig(seed=5, first=4, every=3)
    fp = Failpoints(config, EventBus())
    for site in Site:
        k, n = schedule(5, site, 4, 3)
        assert 1 <= k <= 4 and 3 <= n <= 6
        assert firings(fp, site, 40) == list(range(k, 41, n))
        assert fp.hits[site] == 40 and fp.fired[site] == len(range(k, 41, n))


def test_the_schedule_follows_the_seed_and_never_fails_two_hits_in_a_row():
    plans = {seed: [schedule(seed, s, 2, 2) for s in Site] for seed in range(20)}
    assert plans[3] == [schedule(3, s, 2, 2) for s in Site]  # same seed, same plan
    assert len({tuple(p) for p in plans.values()}) > 1  # the seed matters
    for seed in range(20):
        fp = Failpoints(FailpointConfig(seed=seed, first=2, every=2), EventBus())
        for site in Site:
            fired = firings(fp, site, 30)
            assert fired[0] <= 2, "a site hit `first` times has failed"
            assert all(b - a >= 2 for a, b in itertools.pairwise(fired))


def test_a_firing_emits_one_event_and_sites_limit_what_fails():
    bus = EventBus()
    seen: list[FailpointFired] = []
    bus.subscribe(FailpointFired, seen.append)
    fp = Failpoints(FailpointConfig(first=1, every=2, sites=["tier.load"]), bus)
    assert fp.failing_group(Site.TIER_LOAD, {LINEAR_STATE: 1, "swa.window": 1}) == "swa.window"
    assert fp.failing_group(Site.TIER_LOAD, {LINEAR_STATE: 1}) is None  # hit 2
    assert fp.failing_group(Site.TIER_LOAD, {LINEAR_STATE: 0}) is None  # no pages: no hit
    assert not any(fp.fires(Site.ALLOCATE_PREFILL, FULL_KV) for _ in range(10))
    assert seen == [FailpointFired(site="tier.load", hit=1, group="swa.window")]
    assert {s: n for s, n in fp.hits.items() if n} == {Site.TIER_LOAD: 2, Site.ALLOCATE_PREFILL: 10}
    assert set(fp.hits) == set(Site)  # a table of every site, whatever was hit


def test_off_counts_nothing_and_fails_nothing():
    fp = Failpoints(None, EventBus())
    assert not any(fp.fires(site, FULL_KV) for site in Site for _ in range(50))
    assert fp.failing_group(Site.ADMIT_WORKING, {FULL_KV: 3}) is None
    assert not fp.hits and not fp.fired


def test_disarmed_counts_nothing_and_fails_nothing_and_arming_goes_on_with_the_schedule():
    config = FailpointConfig(seed=5, first=4, every=3)
    k, n = schedule(5, Site.ALLOCATE_PREFILL, 4, 3)
    fp = Failpoints(config, EventBus())
    assert firings(fp, Site.ALLOCATE_PREFILL, 5) == [h for h in range(k, 6, n)]
    fp.arm(False)
    assert not any(fp.fires(site, FULL_KV) for site in Site for _ in range(50))
    assert fp.failing_group(Site.ADMIT_WORKING, {FULL_KV: 3}) is None
    assert fp.hits[Site.ALLOCATE_PREFILL] == 5 and fp.hits[Site.ADMIT_WORKING] == 0
    fp.arm(True)  # hit 6 onwards, as if the disarmed ones never happened
    resumed = [h + 5 for h in firings(fp, Site.ALLOCATE_PREFILL, 20)]
    assert resumed == [h for h in range(k, 26, n) if h > 5]


def test_an_engine_armed_and_disarmed_between_steps_fails_only_while_armed():
    config = EngineConfig(cache=small_cache(failpoints=FailpointConfig(first=1, every=2)))
    engine = Engine(config)
    seen: list[FailpointFired] = []
    engine.events.subscribe(FailpointFired, seen.append)
    engine.arm_failpoints(False)
    for prompt in ("a clean first request", "and a second one"):
        engine.add_request(prompt, SamplingParams(max_tokens=4))
    while engine.has_unfinished():
        engine.step()
    assert seen == []
    engine.arm_failpoints(True)
    engine.add_request("now it fails somewhere", SamplingParams(max_tokens=4))
    while engine.has_unfinished():
        engine.step()
    assert seen


# -- config ------------------------------------------------------------------------------
def test_failpoints_are_off_by_default_and_a_json_override_switches_them_on():
    assert EngineConfig().cache.failpoints is None
    overrides = {"cache": {"failpoints": {"seed": 7, "every": 5, "sites": ["tier.load"]}}}
    config = apply_overrides(EngineConfig(), overrides)
    assert config.cache.failpoints == FailpointConfig(seed=7, every=5, sites=["tier.load"])
    assert config.cache.failpoints.sites == {Site.TIER_LOAD}
    served = engine_config(ServeOptions(overrides={"cache": {"failpoints": {"seed": 3}}}))
    assert served.cache.failpoints == FailpointConfig(seed=3)


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"sites": ["tier.unload"]}, "unknown failpoint site"),
        ({"first": 0}, "failpoints.first must be >= 1"),
        ({"every": 1}, "failpoints.every must be >= 2"),
        ({"rate": 3}, "unknown config field 'cache.failpoints.rate'"),
    ],
)
def test_a_bad_failpoint_config_names_what_is_wrong(bad, says):
    with pytest.raises(ValueError, match=says):
        apply_overrides(EngineConfig(), {"cache": {"failpoints": bad}})


# -- sites -------------------------------------------------------------------------------
def cache_sources() -> dict[str, str]:
    folder = ROOT / "engine" / "cache"
    return {p.name: p.read_text() for p in sorted(folder.glob("*.py")) if p.name != "failpoints.py"}


def test_every_allocation_names_its_site_and_every_site_is_named_at_one():
    """Pages are taken from a pool only in storage.py; everywhere else through the
    storage (``self.store`` / ``self._store``), naming a ``Site``; each site is
    named where the cache allocates, and described."""
    sources = cache_sources()
    for name, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            verb = getattr(node.func, "attr", "") if isinstance(node, ast.Call) else ""
            if verb in ("alloc", "alloc_groups") and name != "storage.py":
                owner = ast.unparse(node.func.value)
                assert owner in ("self.store", "self._store"), f"{name}: {owner}.{verb}"
                assert any(k.arg == "site" for k in node.keywords), f"{name}: {verb} without site"
    named = {site for site in Site if any(f"Site.{site.name}" in s for s in sources.values())}
    assert named == set(Site)
    assert set(SITES) == set(Site) and all(SITES.values())
    assert MODE_SITES[RADIX] | MODE_SITES[SLOTS] == set(Site)


def storage(**failpoints) -> CacheStorage:
    config = cache_config(window=8, interval=8, page=4, full=24, swa=32, snapshots=6, host=2)
    config = dataclasses.replace(config, failpoints=FailpointConfig(**failpoints))
    return CacheStorage(config, INT_LAYOUTS)


def test_a_failing_site_raises_what_a_full_pool_raises_and_holds_nothing_new():
    store = storage(first=1, every=2, sites=["admit.working"])
    owner = Owner(OwnerKind.REQUEST, 1)
    free = {g: p.free_count for g, p in store.pools.items()}
    counts = {LINEAR_STATE: 1, SWA_KV: 2, FULL_KV: 3}
    with pytest.raises(PoolExhausted, match=r"full\.kv .* \(failpoint admit\.working, hit 1\)"):
        store.alloc_groups(counts, owner, site=Site.ADMIT_WORKING)
    assert {g: p.free_count for g, p in store.pools.items()} == free  # the undo ran
    got = store.alloc_groups(counts, owner, site=Site.ADMIT_WORKING)  # hit 2 passes
    assert {g: len(ids) for g, ids in got.items()} == counts
    _, n = schedule(0, Site.ADMIT_WORKING, 1, 2)
    for _ in range(n - 2):
        store.alloc(SWA_KV, 1, owner, site=Site.ADMIT_WORKING)
    with pytest.raises(FailpointExhausted) as raised:  # hit 1 + n
        store.alloc(SWA_KV, 1, owner, site=Site.ADMIT_WORKING)
    assert raised.value.site is Site.ADMIT_WORKING and raised.value.group == SWA_KV


# -- the engine with failpoints on -----------------------------------------------------------
COVERAGE = {
    RADIX: Workload(
        mode=RADIX,
        failpoints=FailpointConfig(seed=0, every=8),
        max_running=4,
        chunk=64,
        retract_every=3,
        pools="tight",
        sessions=3,
        turns=4,
    ),
    SLOTS: Workload(
        mode=SLOTS,
        failpoints=FailpointConfig(seed=0, every=8),
        max_running=4,
        chunk=16,
        pools="tight",
    ),
}


@functools.cache
def coverage_run(mode: PrefixCacheMode) -> Outcome:
    return FailpointRun(COVERAGE[mode]).run()


@pytest.mark.parametrize("mode", [RADIX, SLOTS])
def test_with_failpoints_on_every_oracle_holds(mode):
    """Clean probe and bounds after every step, cache-off outputs or clean
    failures, no hang, every pool empty after the flush (``FailpointRun``)."""
    outcome = coverage_run(mode)
    assert outcome.finished >= 3 * len(outcome.failed), outcome.failed


@pytest.mark.parametrize("mode", [RADIX, SLOTS])
def test_every_site_fires_in_a_short_run(mode):
    assert set(coverage_run(mode).fired) == {s.value for s in MODE_SITES[mode]}


WORKLOADS = st.builds(
    Workload,
    mode=st.sampled_from([RADIX, SLOTS]),
    failpoints=st.builds(
        FailpointConfig,
        seed=st.integers(0, 10**6),
        first=st.integers(1, 3),
        every=st.integers(2, 9),
    ),
    seed=st.integers(0, 10**6),
    max_running=st.integers(1, 8),
    chunk=st.sampled_from([3, 16, 64, 80]),
    spec=st.booleans(),
    pools=st.sampled_from(["roomy", "tight", "tiny"]),
    retract_every=st.sampled_from([0, 0, 4, 7]),
    conversations=st.integers(1, 3),
    sessions=st.integers(0, 3),
    turns=st.integers(2, 4),
    noise=st.integers(0, 2),
)


SLOW = pytest.mark.slow


@pytest.mark.parametrize("seed", [2, 11, 14, *(pytest.param(s, marks=SLOW) for s in (6, 8, 9, 13))])
def test_varied_seeded_workloads_with_failpoints_on(seed):
    """Radix on tiny pools, slots on tight ones, radix on roomy ones (``varied``);
    `make test` adds prefill a token at a time and failure-heavy schedules.
    Every check is the run's."""
    FailpointRun(varied(seed)).run()


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=WORKLOADS)
def test_many_random_workloads_with_failpoints_on(workload):
    FailpointRun(workload).run()


def event_trace(workload: Workload) -> tuple[list[tuple], FailpointRun]:
    """Every event of a run. The closing flush evicts in set order (any order
    frees the same), so its trailing evictions are sorted."""
    run = FailpointRun(workload)
    trace: list[tuple] = []
    for kind in (v for v in vars(events).values() if isinstance(v, type) and hasattr(v, "_fields")):
        run.engine.events.subscribe(kind, trace.append)
    run.run()
    flushed = (NodeEvicted, SnapshotReleased, events.PagesRemoved)
    cut = max(i for i, e in enumerate(trace) if not isinstance(e, flushed)) + 1
    return trace[:cut] + sorted(trace[cut:], key=repr), run


def test_with_failpoints_off_nothing_fires_and_nothing_changes():
    """Off, nothing is counted and no event differs from a run whose schedule
    counts every hit but fails none (nor from the cache-off outputs: FailpointRun)."""
    workload = Workload(failpoints=None, retract_every=3, pools="tight", sessions=2, chunk=16)
    off, off_run = event_trace(workload)
    never = FailpointConfig(first=10**9, every=10**9)
    counted, counted_run = event_trace(dataclasses.replace(workload, failpoints=never))
    assert off == counted and off
    assert not any(isinstance(e, FailpointFired) for e in off)
    assert not off_run.engine._cache.failpoints.hits
    assert any(counted_run.engine._cache.failpoints.hits.values())  # sites reached


# -- what the failpoint runs found -------------------------------------------------------------
def test_a_retracted_request_that_pins_nothing_does_not_count_as_unpinned():
    """Two parked session slots fill the linear.state pool; a retracted request
    comes back with nothing running. Its recovery point is given up first, then
    its admission opens a fresh holder, which pins nothing: releasing that must
    not count as unpinning (the head would retry forever, failing nothing, and
    the slots would never be dropped). A parked slot goes instead, and it runs."""
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    engine = Engine(EngineConfig(cache=small_cache(full=64, swa=48, state=4, host=0)))
    prompt = list(range(40, 80))
    rid = engine.add_request(prompt, params)
    engine.step()
    engine.retract(rid, hold_steps=50)
    for i in range(2):
        turn = engine.add_request([50 + i] * 40, params, session_id=engine.open_session())
        while not engine.request_info(turn).done:
            engine.step()
        assert engine.take(turn).error is None
    assert engine.probe().groups[LINEAR_STATE].free == 0  # the parked slots pin it all
    for _ in range(200):
        if not engine.has_unfinished():
            break
        engine.step()
    assert not engine.has_unfinished(), "the retracted request never came back"
    done = engine.take(rid)
    assert done.error is None and done.token_ids == oracle(prompt, params)
    assert engine.probe().clean
