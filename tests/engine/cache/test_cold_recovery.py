"""A cold request pushed out to the host tier whose snapshot cannot be loaded back.

Nothing above its own snapshot is usable (it shares no page with anything), so
the descent that locked its path for the load gives every ref back, the root's
too, and it recomputes from nothing::

    root ── (16 tokens, no state) ── A (4 more, snapshot on the host)
    match: lock the root and the path; A's load fails -> unlock the path and the root, resume 0

Seed 002's root ref leak on a miss has this twin on the load path: the
registered fault keeps that root ref here as well, and the audit sees it.
"""

from __future__ import annotations

from cachesim import INT_LAYOUTS, SimRunner, cache_config, run_turn

from kvwatch.engine.cache.audit import audit
from kvwatch.engine.cache.backends import build_cache
from kvwatch.engine.cache.failpoints import Failpoints, Site
from kvwatch.engine.cache.node import Tier
from kvwatch.engine.cache.protocol import holder_of
from kvwatch.engine.config import FailpointConfig
from kvwatch.engine.events import EventBus, FailpointFired
from kvwatch.engine.faults import parse_faults

CONFIG = cache_config(window=8, interval=16, page=4, full=64, swa=32, snapshots=12, host=4)


def cold_recovery(faults: tuple[str, ...] = ()):
    cache = build_cache(CONFIG, INT_LAYOUTS, faults=parse_faults(faults))
    sim = SimRunner(cache)
    a = cache.open(list(range(100, 120)))
    cache.match(a)
    run_turn(sim, a, [], chunk=8, decode=[])
    cache.retract(a)
    anchor = holder_of(a).anchor
    assert anchor.snapshot.tier is Tier.HOST
    above = [n for n in anchor.path() if n is not anchor and not n.is_root]
    assert not any(n.has_complete_snapshot for n in above)  # nothing else to resume from
    cache.failpoints.fail_next(Site.TIER_LOAD)
    holder_of(a).tokens.append(7)
    return cache, sim, a, cache.match(a)


def test_a_cold_recovery_whose_load_fails_gives_every_ref_back_and_starts_over():
    cache, sim, a, match = cold_recovery()
    assert match.resume_len == 0
    assert cache.view.tree.root.refs == 0
    sim.check_holder(a)
    assert audit(cache.view).clean


def test_the_root_ref_leak_fault_keeps_the_roots_ref_there_and_the_audit_sees_it():
    cache, _, _, match = cold_recovery(("root-ref-leak-on-miss",))
    assert match.resume_len == 0
    details = [f.detail for f in audit(cache.view).findings]
    assert any(d.startswith("root: refs") for d in details), details


def test_fail_next_fails_one_hit_whatever_the_schedule():
    fired = []
    bus = EventBus()
    bus.subscribe(FailpointFired, fired.append)
    off = Failpoints(None, bus)  # failpoints off: only the forced hit fails
    off.fail_next(Site.TIER_LOAD)
    assert off.fires(Site.TIER_LOAD, "linear.state") and not off.fires(Site.TIER_LOAD, "x")
    assert off.failing_group(Site.TIER_LOAD, {"full.kv": 1}) is None
    on = Failpoints(FailpointConfig(seed=0, first=8, every=32), bus)
    on.arm(False)  # disarmed, the schedule waits; a forced failure does not
    on.fail_next(Site.TIER_LOAD)
    assert on.failing_group(Site.TIER_LOAD, {"swa.window": 2, "linear.state": 1}) == "linear.state"
    assert on.hits[Site.TIER_LOAD] == on.fired[Site.TIER_LOAD] == 1
    assert not on.forced
    assert [f.site for f in fired] == ["tier.load", "tier.load"]
