"""Failpoints: every place where a full pool can make a cache operation fail, failed on purpose.

A shortage reaches each failure path below only when the pools happen to be
full at that very moment. With ``CacheConfig.failpoints`` set, each site fails
on a schedule instead, the way SQLite's out-of-memory tests fail every
allocation in turn, so every path runs in a short run whatever the load.

A site fails exactly as a real shortage there does, so the engine's own
handling runs and nothing else: an allocation raises ``PoolExhausted`` from
``CacheStorage.alloc`` / ``alloc_groups`` (a ``FailpointExhausted``, whose
message names the failpoint), as if pruning, eviction and the reclaimers had
found nothing to free; a tier move answers ``False`` ("no room") after
undoing what it had allocated. Where an allocation spans several groups, the
last group with pages to take fails, so the pages taken in the others are
given back by the same undo a real shortage in that group runs.

The schedule (``FailpointConfig``): each site fails its hit number ``k``,
then every ``N``-th hit after (``k + N``, ``k + 2N``, ...), with ``k`` drawn
from ``[1, first]`` and ``N`` from ``[every, 2 * every]`` by a generator
seeded with the seed and the site's name. Hence

* a site hit ``first`` times has failed at least once (defaults: ``first`` 2,
  ``every`` 32, so a short run fails every site it reaches twice, and later
  failures are about one hit in N);
* two hits of a site in a row never both fail (``N >= 2``), so a caller that
  retries after a failure (dropping its drafts, retracting another request)
  gets through on its next try;
* the same seed gives the same failures for the same sequence of hits.

A hit is a call that asks for at least one page (an empty allocation cannot
fail). Each failure emits ``FailpointFired``; the probe records nothing new.
Off (``None``), a site costs one attribute test and counts nothing.

``fail_next(site)`` makes the site's next hit fail whatever the schedule, even
with failpoints off or disarmed: a test control (``kvwatch.fail_load`` on a
request the server pushes out) that puts a failure where a load can only time
it by luck, as SQLite's tests fail one chosen allocation.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING

from kvwatch.engine.events import EventBus, FailpointFired

if TYPE_CHECKING:
    from kvwatch.engine.config import FailpointConfig


class Site(StrEnum):
    ADMIT_WORKING = "admit.working"
    SLOT_RESTORE = "slot.restore"
    ALLOCATE_PREFILL = "allocate.prefill"
    ALLOCATE_DECODE = "allocate.decode"
    ALLOCATE_DRAFTS = "allocate.drafts"
    SNAPSHOT_INTERVAL = "snapshot.interval"
    SNAPSHOT_BRANCH = "snapshot.branch"
    SNAPSHOT_TRACK = "snapshot.track"
    SLOT_STAGE = "slot.stage"
    TIER_OFFLOAD = "tier.offload"
    TIER_LOAD = "tier.load"
    SESSION_WINDOW = "session.window"


# Every site, what it allocates, and what its failure makes the engine do.
SITES: Mapping[Site, str] = MappingProxyType(
    {
        Site.ADMIT_WORKING: "a request's working state and window pages at admission (match); "
        "it stays queued, or fails if nothing runs and nothing can be unpinned",
        Site.SLOT_RESTORE: "slots: a holder's own copy of a slot's pages at admission; "
        "as admit.working",
        Site.ALLOCATE_PREFILL: "the full.kv and swa.kv pages of a request's next prefill "
        "chunk; the newest request is retracted, a lone one unpins or fails",
        Site.ALLOCATE_DECODE: "the page slot of a request's next decode token; as prefill",
        Site.ALLOCATE_DRAFTS: "the k + 1 slots of a verify step; its drafts are dropped "
        "and it decodes one token instead",
        Site.SNAPSHOT_INTERVAL: "the state pages of a snapshot at a snapshot_interval "
        "boundary; skipped (SnapshotSkipped)",
        Site.SNAPSHOT_BRANCH: "the state pages of a branch-point snapshot (the prompt left "
        "the tree there, or a queued request waits there); skipped",
        Site.SNAPSHOT_TRACK: "the state pages of the frontier snapshot that ends a turn "
        "(first capture of a holder); skipped",
        Site.SLOT_STAGE: "slots: the whole-state copy staged at the turn boundary; "
        "the slot ticket aborts (no room)",
        Site.TIER_OFFLOAD: "host pages for a retracted request's recovery snapshot; it "
        "stays on the device",
        Site.TIER_LOAD: "device pages to bring a host-tier snapshot back at recovery; "
        "the request recovers from a shallower snapshot",
        Site.SESSION_WINDOW: "swa.kv pages of the window a session slot rewinds to "
        "(resume, rollback); the slot is dropped and the next turn matches the tree",
    }
)


def parse_sites(names: Iterable[str]) -> frozenset[Site]:
    """Site names as ``Site`` members; ``ValueError`` naming the known ones otherwise."""
    try:
        return frozenset(Site(name) for name in names)
    except ValueError as exc:
        known = ", ".join(s.value for s in Site)
        raise ValueError(f"unknown failpoint site: {exc}; sites are {known}") from None


def schedule(seed: int, site: Site, first: int, every: int) -> tuple[int, int]:
    """``(k, N)`` for ``site``: its first failing hit and the period after it."""
    rng = random.Random(f"kvwatch-failpoints:{seed}:{site.value}")
    return rng.randint(1, first), rng.randint(every, 2 * every)


class Failpoints:
    """The failure schedule one cache consults at each of its ``Site`` s.

    Invariants: off (no config), nothing is counted and nothing fails; on, a
    site outside ``config.sites`` (when given) is counted and never fails;
    ``fired[s] <= hits[s]`` and a failure is emitted once, as it happens.
    """

    # ``forced`` holds each site at most once; a failure armed for a load that never
    # came stays armed (registry walks check the bound)
    __bounded__ = MappingProxyType({"forced": len(Site)})

    def __init__(self, config: FailpointConfig | None, events: EventBus) -> None:
        self.on = config is not None
        # disarmed, no site counts a hit or fails: the schedule waits (``arm``)
        self.armed = True
        self.events = events
        # one tally per site, every site's key there from the start: a fixed-size
        # table, which a registry walk sees the same size before and after a run
        sites = Site if self.on else ()
        self.hits: dict[Site, int] = dict.fromkeys(sites, 0)
        self.fired: dict[Site, int] = dict.fromkeys(sites, 0)
        self.forced: set[Site] = set()  # sites whose next hit fails (``fail_next``)
        self._plan: dict[Site, tuple[int, int]] = {}
        if config is not None:
            for site in config.sites or Site:
                self._plan[site] = schedule(config.seed, site, config.first, config.every)

    def fires(self, site: Site, group: str) -> bool:
        """Count a hit of ``site`` (one that asks for pages of ``group``); True if it fails."""
        if site in self.forced:
            return self._forced(site, group)
        if not self.on or not self.armed:
            return False
        self.hits[site] += 1
        hit = self.hits[site]
        plan = self._plan.get(site)
        if plan is None:
            return False
        k, n = plan
        if hit < k or (hit - k) % n:
            return False
        self.fired[site] += 1
        self.events.emit(FailpointFired(site=site.value, hit=hit, group=group))
        return True

    def fail_next(self, site: Site) -> None:
        """Fail ``site``'s next hit, whatever the schedule says and whether or not
        failpoints are on; later hits follow the schedule again."""
        self.forced.add(site)

    def _forced(self, site: Site, group: str) -> bool:
        self.forced.discard(site)
        if self.on:
            self.hits[site] += 1
            self.fired[site] += 1
        self.events.emit(FailpointFired(site=site.value, hit=self.hits.get(site, 0), group=group))
        return True

    def arm(self, armed: bool) -> None:
        """Count and fail from now on (True), or neither until armed again (False):
        the schedule goes on from the hits counted while armed."""
        self.armed = armed

    def failing_group(self, site: Site, counts: Mapping[str, int]) -> str | None:
        """One hit of ``site`` for an allocation of ``counts`` pages by group: the
        group that must fail (the last one asked for), or None."""
        if not (self.forced or (self.on and self.armed)):
            return None  # the common case, off: no list built
        wanted = [group for group, n in counts.items() if n > 0]
        if wanted and self.fires(site, wanted[-1]):
            return wanted[-1]
        return None
