"""kvwatch's probe over LightLLM's own structures: a ``ProbeReport`` after any loop iteration.

``InferProbe(loop).report()`` returns a ``kvwatch.contracts.ProbeReport``:

* one ``GroupReport`` per pool (``lightllm.kv``, ``lightllm.req``; with the
  linear cache ``lightllm.state``, the big-page state buffers, and
  ``lightllm.small_state``, the small-page ones): ``by_owner`` counts what
  the tree and the live requests hold, ``evictable`` what the tree holds
  unreferenced;
* the audit's findings (``state_read`` -> ``slot_audit``, ``tree_read``);
* ``root_refs``: for the plain ``RadixCache`` the root's ``ref_counter``
  against 1 + the live requests (its ``match_prefix`` releases the root on
  a miss, so that is its contract). For the ``LinearAttPagedRadixCache``
  the root's counter is not a ``RootRefs`` (``RootRefs(0, 0)``) but a
  notice (``contracts.NOTICE``, reported with the run, no detector fails on
  it) when it is above its pin and anchors: its
  ``match_prefix`` keeps the root ref it took on a miss or a trim to
  nothing, and ``deref_to_first_big_page_node`` when it reaches the root, by
  design: the counter is a pin (it starts at 1), no code reads it for a
  decision (the root is never in ``_evict_tree_set``, ``_evict`` asserts it
  never gets it, and it holds no token, so ``refed_tokens_num`` does not
  move), and LightLLM's maintainers took the release of it out of PR #1348
  (commit 8ec5a2a7). A counter *below* 1 + the live anchors is still a
  ``ref_mismatch`` for both caches;
* ``registries``: the container sizes of ``object_sizes.walk``.

After every iteration the probe notes who held each unit (``remember``, an
observer of the loop), so an orphan names its last holder and what became
of it (``request 7 pending big page at 16, aborted at iteration 3``). With
``watch()`` it audits after every iteration and keeps the first reports
that show a finding (``latched()``), for the recorder's next barrier
(``kvwatch.targets.driver.step_probe``).

The flush is the loop's (``loop.InferLoop.flush``: the cache's own eviction).

Invariant: the probe only reads LightLLM's state.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kvwatch.contracts import (
    EngineStats,
    Finding,
    GroupReport,
    ProbeReport,
    QueueReport,
    RootRefs,
    TreeReport,
)
from kvwatch.targets.driver.step_probe import StepProbe
from kvwatch.targets.lightllm import object_sizes, slot_audit, state_read, tree_read
from kvwatch.targets.lightllm.loop import InferLoop
from kvwatch.targets.lightllm.state_read import KV, SMALL, STATE, Holding, PoolView

OWNERS = ("tree", "request")


class InferProbe(StepProbe):
    def __init__(self, loop: InferLoop) -> None:
        super().__init__()
        self.loop = loop
        loop.observers.append(self.remember)

    # -- per-iteration watching (StepProbe) --------------------------------------------------
    def holdings(self) -> Iterable[tuple[str, list[Holding]]]:
        views = self.pools(state_read.nodes_of(self.loop.parts.radix))
        return [(view.group, view.holdings) for view in views]

    def last(self, group: str, unit: int) -> str:
        who, rid = self.last_seen(group, unit)
        ends = [o for o in self.loop.outcomes if o.rid == rid]
        if ends:
            return f"{who}, {ends[-1].status} at iteration {ends[-1].step}"
        if rid in self.loop.aborts and rid not in self.loop.parts.ctx.requests_mapping:
            return f"{who}, aborted and never released"
        return who

    # -- the report --------------------------------------------------------------------------
    def pools(self, nodes: list[Any]) -> list[PoolView]:
        parts, live = self.loop.parts, self.loop.live()
        views = []
        if self.loop.linear:  # the small state pools first: their leaks run them dry first
            views.append(state_read.big_page_pool(parts.mem, nodes, live))
            views.append(state_read.small_page_pool(parts.small, nodes, live))
        views.append(state_read.kv_pool(parts.mem, parts.req_manager, nodes, live))
        views.append(state_read.req_pool(parts.req_manager, live))
        return views

    def _groups(self, nodes: list[Any], findings: list[Finding]) -> dict[str, GroupReport]:
        groups = {}
        for view in self.pools(nodes):
            found, counts = slot_audit.audit_pool(view, self.last)
            findings += found
            self.note(view.group, view.holdings)
            groups[view.group] = GroupReport(
                family="state" if view.group in (STATE, SMALL) else "history",
                capacity=len(view.universe),
                free=len(set(view.free)),
                by_owner={k: counts[k] for k in OWNERS},
                evictable=self._evictable(view.group, nodes),
                host_capacity=0,
            )
        return groups

    @staticmethod
    def _evictable(group: str, nodes: list[Any]) -> int:
        unreferenced = [n for n in nodes[1:] if n.ref_counter == 0]
        if group == KV:
            return sum(len(n.token_mem_index_value) for n in unreferenced)
        if group == STATE:
            return sum(1 for n in unreferenced if n.big_page_buffer_idx is not None)
        if group == SMALL:
            return sum(1 for n in nodes if n.small_page_buffer_idx is not None)
        return 0

    def _request_findings(self) -> list[Finding]:
        """What a live request holds that it cannot give back (first: the pools'
        orphans may be its consequence)."""
        parts, live = self.loop.parts, self.loop.live()
        out = slot_audit.audit_stale(state_read.stale_pending(live)) if self.loop.linear else []
        return out + slot_audit.audit_prefixes(
            KV, state_read.prefix_mismatches(parts.req_manager, live)
        )

    def _findings(self, nodes: list[Any]) -> list[Finding]:
        parts = self.loop.parts
        anchored = state_read.anchors(self.loop.live())
        out = slot_audit.audit_refs(KV, tree_read.node_refs(nodes, anchored))
        root = nodes[0]
        out += slot_audit.audit_root_floor(KV, int(root.ref_counter), anchored[id(root)])
        if self.loop.linear:  # its drift above the pin is by design: a notice
            out += slot_audit.notice_root_drift(KV, int(root.ref_counter), anchored[id(root)])
        problems = tree_read.eviction_problems(parts.radix, nodes, linear=self.loop.linear)
        out += slot_audit.audit_tree(KV, tree_read.tree_counts(parts.radix, nodes), problems)
        return out

    def root_refs(self, nodes: list[Any]) -> RootRefs:
        if self.loop.linear:  # a notice instead (``_findings``; the module's docstring)
            return RootRefs(actual=0, expected=0)
        expected = 1 + state_read.anchors(self.loop.live())[id(nodes[0])]
        return RootRefs(actual=int(nodes[0].ref_counter), expected=expected)

    def _stats(self, nodes: list[Any], groups: dict[str, GroupReport]) -> EngineStats:
        live = self.loop.live()
        paused = sum(1 for r in live if r.paused)
        snapshots = {}
        if self.loop.linear:
            snapshots[STATE] = sum(1 for n in nodes[1:] if n.big_page_buffer_idx is not None)
            snapshots[SMALL] = sum(1 for n in nodes if n.small_page_buffer_idx is not None)
        tree = TreeReport(
            nodes=len(nodes) - 1,
            snapshots=snapshots,
            host_snapshots=0,
            interior_snapshots={},
            tokens=sum(len(n.token_mem_index_value) for n in nodes[1:]),
        )
        queue = QueueReport(
            waiting=len(self.loop.waiting) + len(self.loop.parts.io.cmds),
            running=len(live) - paused,
            retracted=0,
            paused=paused,
        )
        return EngineStats(
            step=self.loop.iterations,
            live_requests=len(live),
            live_sessions=0,
            groups=groups,
            root_refs=self.root_refs(nodes),
            tree=tree,
            queue=queue,
            record_bytes=0,
        )

    def report(self) -> ProbeReport:
        nodes = state_read.nodes_of(self.loop.parts.radix)
        findings = self._request_findings()
        groups = self._groups(nodes, findings)
        findings += self._findings(nodes)
        return ProbeReport(
            stats=self._stats(nodes, groups),
            findings=tuple(findings),
            bounds={},
            registries=object_sizes.walk(object_sizes.roots(self.loop.parts)),
        )
