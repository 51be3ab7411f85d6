"""kvwatch's probe over SGLang's own structures: a ``ProbeReport`` after any scheduler step.

``CacheProbe(loop).report()`` returns a ``kvwatch.contracts.ProbeReport``:

* one ``GroupReport`` per pool (``sglang.kv``, ``sglang.swa`` with a sliding
  window cache, ``sglang.mamba`` with a mamba cache; ``pool_holders.py``),
  its ``by_owner`` counting what the tree, the live requests and the
  streaming-session slots hold, its ``evictable`` the unlocked tree pages;
* the audit's findings (``pool_audit.py``), and one ``REGISTRY`` finding per
  container SGLang bounds that holds more than its bound;
* ``registries``: the size of every container SGLang's cache, session and
  pool objects hold (``registry_walk.py``), for ``quiescence``;
* the driver's own findings (``loop.checks()``): a scheduler that stopped
  admitting (``admission_watch.py``, a ``starved`` finding).

The pools' *universe* is what was free when the probe was built (the
driver's pools are new and empty then): a unit of the universe that is neither free
nor held is an orphan, and one outside it, free or held, is double owned (SGLang's
padding page 0, a page past the allocator's last). The tree's counters are checked
at the run's page size. After every step the probe notes who held each unit
(``remember``, an observer of the driver), so an orphan names its last holder
and what became of it ("..., finished at step 12"). With ``watch()`` it also
audits after every step and keeps the first reports that show a finding
(``latched()``, what kvwatch's recorder collects at the next barrier), so a
state that is wrong only while requests run is judged too
(``kvwatch.targets.driver.step_probe``).

The flush is the loop's (``loop.SchedulerLoop.flush``: the release's own
eviction).

Invariant: the probe only reads SGLang's state.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kvwatch.contracts import (
    EngineStats,
    Finding,
    FindingKind,
    GroupReport,
    ProbeReport,
    QueueReport,
    RootRefs,
    TreeReport,
    finding,
)
from kvwatch.targets.driver.step_probe import StepProbe
from kvwatch.targets.sglang import cache_views, pool_audit, registry_walk
from kvwatch.targets.sglang.cache_views import NodeView, inner
from kvwatch.targets.sglang.pool_holders import KV, MAMBA, SWA, Holding, PoolReader

OWNERS = ("tree", "request", "session")


class CacheProbe(StepProbe):
    def __init__(self, loop: Any) -> None:
        super().__init__()
        self.loop = loop
        self.read = PoolReader(loop)
        self.universe: dict[str, set[int]] = {KV: set(self.read.kv_free())}
        if self.read.swa:
            self.universe[SWA] = set(self.read.swa_free())
        if (mamba := self.read.mamba_free()) is not None:
            self.universe[MAMBA] = set(mamba)
        loop.observers.append(self.remember)

    # -- per-step watching (StepProbe) -------------------------------------------------------
    def holdings(self) -> Iterable[tuple[str, list[Holding]]]:
        return self.read.holdings(self.read.nodes()).items()

    def last(self, group: str, unit: int) -> str:
        who, rid = self.last_seen(group, unit)
        ends = [o for o in self.loop.outcomes if o.rid == rid]
        return f"{who}, {ends[-1].status} at step {ends[-1].step}" if ends else who

    # -- the report --------------------------------------------------------------------------
    def _free(self, group: str) -> list[int]:
        if group == KV:
            return self.read.kv_free()
        return self.read.swa_free() if group == SWA else self.read.mamba_free() or []

    def _groups(self, nodes: list[NodeView], findings: list[Finding]) -> dict[str, GroupReport]:
        held = self.read.holdings(nodes)
        groups = {}
        for group, universe in self.universe.items():
            free = self._free(group)
            found, counts = pool_audit.audit_group(group, free, universe, held[group], self.last)
            findings += found
            self.note(group, held[group])
            evictable = 0
            if group == KV:
                unlocked = [n.full for n in nodes[1:] if n.full is not None and n.full_lock == 0]
                evictable = len({u for tokens in unlocked for u in self.read.units(tokens)})
            groups[group] = GroupReport(
                family="state" if group == MAMBA else "history",
                capacity=len(universe),
                free=len(set(free)),
                by_owner={k: counts[k] for k in OWNERS},
                evictable=evictable,
                host_capacity=0,
            )
        return groups

    def _locks(self) -> list[cache_views.Lock]:
        loop, cache = self.loop, self.loop.tree_cache
        live = loop.live_requests()
        recorded = cache_views.is_unified(cache) and all(map(cache_views.records_locks, live))
        holders = live if recorded else loop.running_requests()
        locks = [cache_views.lock_of(r, f"request {r.rid}", cache) for r in holders]
        slots = cache_views.session_records(cache).items()
        locks += [cache_views.lock_of(slot, f"session {sid}", cache) for sid, slot in slots]
        return [lock for lock in locks if lock is not None]

    def _stats(self, nodes: list[NodeView], groups: dict[str, GroupReport]) -> EngineStats:
        loop = self.loop
        snapshots = sum(1 for n in nodes[1:] if n.mamba is not None)
        tree = TreeReport(
            nodes=len(nodes) - 1,
            snapshots={MAMBA: snapshots} if MAMBA in self.universe else {},
            host_snapshots=0,
            interior_snapshots={},
            tokens=sum(len(n.full) for n in nodes[1:] if n.full is not None),
        )
        queue = QueueReport(
            waiting=len(loop.waiting_queue),
            running=len(loop.running_requests()),
            retracted=sum(1 for r in loop.waiting_queue if r.is_retracted),
            paused=0,
        )
        return EngineStats(
            step=loop.step_no,
            live_requests=len(loop.live_requests()),
            live_sessions=len(loop.sessions.sessions) if loop.sessions is not None else 0,
            groups=groups,
            root_refs=RootRefs(actual=nodes[0].full_lock, expected=1),
            tree=tree,
            queue=queue,
            record_bytes=0,
        )

    def report(self) -> ProbeReport:
        cache = self.loop.tree_cache
        nodes = self.read.nodes()
        findings: list[Finding] = []
        groups = self._groups(nodes, findings)
        unified = cache_views.is_unified(cache)
        findings += pool_audit.audit_locks(nodes, self._locks(), unified=unified)
        counters = cache_views.size_counters(cache)
        name = type(inner(cache)).__name__
        findings += pool_audit.audit_counters(nodes, counters, name, self.read.page)
        walked = registry_walk.walk(registry_walk.roots(self.loop))
        findings += [finding(FindingKind.REGISTRY, None, [], b) for b in walked.breaches]
        findings += self.loop.checks()  # the driver's liveness (admission_watch)
        return ProbeReport(
            stats=self._stats(nodes, groups),
            findings=tuple(findings),
            bounds={},
            registries=walked.sizes,
        )

    # -- the flush ---------------------------------------------------------------------------
