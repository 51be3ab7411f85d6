"""A retracted request that goes away hands its recovery snapshot back at once.

A retracted holder keeps a host ref on the deepest complete snapshot of its
path, its anchor. When another holder runs through that node, the snapshot
stays on the device for both; the running one cannot release it (host refs
keep a snapshot) even where its own deeper snapshot supersedes it::

    root ── X (snapshot, anchor of A) ── D (snapshot of B) ── B's frontier
             host_refs 1, refs 1 (B)

Once A is aborted while retracted, X is B's alone and superseded: it goes now,
as when a sharer leaves a path, not at B's next commit. Until then B would pin
one snapshot more than the two per holder the usage bound allows.
"""

from __future__ import annotations

from cachesim import INT_LAYOUTS, SimRunner, cache_config, run_turn

from kvwatch.engine.cache.audit import audit
from kvwatch.engine.cache.backends import build_cache
from kvwatch.engine.cache.holder import HolderStatus
from kvwatch.engine.cache.protocol import holder_of
from kvwatch.engine.cache.usage import usage_bounds
from kvwatch.engine.config import STATE_GROUPS

CONFIG = cache_config(window=8, interval=16, page=4, full=64, swa=32, snapshots=12, host=4)


def anchored_below_a_runner():
    cache = build_cache(CONFIG, INT_LAYOUTS)
    sim = SimRunner(cache)
    shared = list(range(1, 21))
    a = cache.open([*shared])
    cache.match(a)
    run_turn(sim, a, [], chunk=8, decode=[])
    b = cache.open([*shared, *range(30, 50)])
    assert cache.match(b).resume_len == len(shared)
    run_turn(sim, b, [], chunk=8, decode=[])
    cache.retract(a)
    anchor = holder_of(a).anchor
    assert a.status is HolderStatus.RETRACTED and anchor.host_refs == 1 and anchor.refs == 1
    assert anchor.has_complete_snapshot  # kept for A's recovery though B's path supersedes it
    return cache, sim, a, b, anchor


def test_an_aborted_retracted_holder_releases_its_superseded_anchor_at_once():
    cache, sim, a, b, anchor = anchored_below_a_runner()
    cache.release(a, commit=False)
    assert not anchor.has_complete_snapshot, "B's superseded snapshot outlived A's abort"
    bounds = usage_bounds(cache.view)
    assert not any(bounds[g].exceeded for g in STATE_GROUPS), bounds
    sim.check_holder(b)
    assert audit(cache.view).clean


def test_a_recovering_holder_still_finds_its_anchor():
    """The release is for the aborted case only: a holder that comes back resumes
    from the anchor it kept."""
    cache, sim, a, _b, anchor = anchored_below_a_runner()
    holder_of(a).tokens.append(7)
    assert cache.match(a).resume_len == anchor.depth
    sim.check_holder(a)
    assert audit(cache.view).clean
