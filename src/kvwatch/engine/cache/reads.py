"""CacheReads: the cache's probe-facing reads, pure, at a step boundary.

``CacheReads`` answers ``AuditableCache`` over a ``CacheView``: ``probe``
takes one reading of everything a probe reports (the audit, usage, bounds,
tree and slot figures), so the parts agree with each other; ``usage`` and
``structure`` are the cheap parts alone, for gauges.
"""

from __future__ import annotations

from kvwatch.contracts import RootRefs, SlotReport, TreeReport
from kvwatch.engine.cache.audit import audit
from kvwatch.engine.cache.node import Node, Tier
from kvwatch.engine.cache.protocol import AuditableCache, ProbeReads
from kvwatch.engine.cache.usage import GroupUsage, group_usage, usage_bounds
from kvwatch.engine.cache.view import CacheView, TreeReads
from kvwatch.engine.config import STATE_GROUPS


def superseded(node: Node) -> bool:
    """Whether a deeper snapshot on the same unbranched path makes ``node``'s
    state redundant: the snapshots seed 000 leaks. A branch point's state (kept
    for the siblings) and the deepest state of a path are not superseded."""
    while len(node.children) == 1:
        node = next(iter(node.children.values()))
        if node.has_complete_snapshot:
            return True
    return False


def tree_report(tree: TreeReads) -> TreeReport:
    snapshots = dict.fromkeys(STATE_GROUPS, 0)
    interior = dict.fromkeys(STATE_GROUPS, 0)
    on_host = 0
    for node in tree.snapshot_nodes:
        on_host += node.snapshot.tier is Tier.HOST
        for group in node.snapshot.pages:
            snapshots[group] += 1
            interior[group] += superseded(node)
    return TreeReport(
        nodes=tree.node_count,
        snapshots=snapshots,
        host_snapshots=on_host,
        interior_snapshots=interior,
        tokens=tree.page_count * tree.page_size,
    )


def counted_root_refs(view: CacheView) -> RootRefs:
    """The root's refs as counted, beside the holders that lock a path."""
    locked = sum(h.lock_node is not None for h in view.holders.values())
    return RootRefs(view.tree.root.refs, locked)


def probe_reads(view: CacheView, slack_tokens: int) -> ProbeReads:
    report = audit(view)
    usage = group_usage(view)  # one reading serves the stats and the bounds
    return ProbeReads(
        audit=report,
        usage=usage,
        bounds=usage_bounds(view, slack_tokens, usage),
        tree=tree_report(view.tree),
        slot_report=view.stored.slot_report(),
        root_refs=report.root_refs,  # the audit's: recomputed from live holders
        stopped_commits=tuple(view.stored.stopped_commits()),
    )


class CacheReads(AuditableCache):
    """What a probe reads off one cache, through its read-only view."""

    def __init__(self, view: CacheView) -> None:
        self._view = view

    def probe(self, slack_tokens: int) -> ProbeReads:
        return probe_reads(self._view, slack_tokens)

    def usage(self) -> dict[str, GroupUsage]:
        return group_usage(self._view)

    def structure(self) -> tuple[TreeReport, SlotReport | None, RootRefs]:
        view = self._view
        return tree_report(view.tree), view.stored.slot_report(), counted_root_refs(view)
