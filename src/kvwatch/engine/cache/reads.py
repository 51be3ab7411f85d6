"""The cache's probe-facing reads: pure, at a step boundary.

``probe_reads`` takes one reading of everything a probe reports (the audit,
usage, bounds, tree and slot figures), so the parts agree with each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvwatch.contracts import RootRefs, TreeReport
from kvwatch.engine.cache.audit import audit
from kvwatch.engine.cache.node import Node, Tier
from kvwatch.engine.cache.protocol import ProbeReads
from kvwatch.engine.cache.radix import RadixTree
from kvwatch.engine.cache.usage import group_usage, usage_bounds
from kvwatch.engine.config import STATE_GROUPS

if TYPE_CHECKING:
    from kvwatch.engine.cache.base import CacheBase


def superseded(node: Node) -> bool:
    """Whether a deeper snapshot on the same unbranched path makes ``node``'s
    state redundant: the snapshots seed 000 leaks. A branch point's state (kept
    for the siblings) and the deepest state of a path are not superseded."""
    while len(node.children) == 1:
        node = next(iter(node.children.values()))
        if node.has_complete_snapshot:
            return True
    return False


def tree_report(tree: RadixTree) -> TreeReport:
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


def counted_root_refs(cache: CacheBase) -> RootRefs:
    """The root's refs as counted, beside the holders that lock a path."""
    locked = sum(h.lock_node is not None for h in cache.holders.values())
    return RootRefs(cache.store.tree.root.refs, locked)


def probe_reads(cache: CacheBase, slack_tokens: int) -> ProbeReads:
    report = audit(cache)
    usage = group_usage(cache)  # one reading serves the stats and the bounds
    return ProbeReads(
        audit=report,
        usage=usage,
        bounds=usage_bounds(cache, slack_tokens, usage),
        tree=tree_report(cache.store.tree),
        slot_report=cache.slot_report(),
        root_refs=report.root_refs,  # the audit's: recomputed from live holders
        stopped_commits=tuple(cache.stopped_commits()),
    )
