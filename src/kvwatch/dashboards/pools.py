""" "kvwatch / Prefix-cache pools": pages per group by owner, State pools, root
refs, snapshots and session-held pages.

    capacity ──────────────────────────────  (line)
    host_evictable │ host │ pinned_session │ pinned_request │ evictable   (stacked, per group)
"""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from kvwatch.dashboards import panels as p
from kvwatch.instrumentation import names as n

UID = "kvwatch-pools"
TITLE = "kvwatch / Prefix-cache pools"
OWNERS = 'state=~"evictable|pinned_request|pinned_session|host|host_evictable"'
USED = 'state="used"'
STATE_FAMILY = 'family="state"'


def _pages(*matchers: str) -> str:
    return p.series(n.POOL_PAGES, p.INSTANCE, *matchers)


def _capacity(*matchers: str) -> str:
    return p.series(n.POOL_CAPACITY, p.INSTANCE, *matchers)


def build() -> Dashboard:
    board = p.dashboard(
        TITLE,
        UID,
        variables=[p.label_variable("group", n.POOL_CAPACITY, "group", p.INSTANCE)],
    )
    return p.with_rows(
        board,
        {
            "Pools by group": _pools_by_group(),
            "Tree, snapshots and sessions": _tree_and_sessions(),
        },
    )


def _pools_by_group() -> list:
    """Pages per group: by owner and against capacity (one panel per ``$group``),
    usage by group, and the State pools by owner."""
    group = 'group=~"$group"'
    by_owner = p.graph(
        "Pages by owner: $group",
        "none",
        (f"sum by (state) ({_pages(group, OWNERS)})", "{{state}}"),
        stacked=True,
    ).repeat("group")
    against_capacity = p.graph(
        "Used against capacity: $group",
        "none",
        (f"sum({_pages(group, USED)})", "used"),
        (f"sum({_capacity(group)})", "capacity"),
    ).repeat("group")
    usage = p.bars(
        "Usage by group",
        "percentunit",
        f"sum by (group) ({_pages(USED)}) / sum by (group) ({_capacity()})",
        "{{group}}",
    )
    state_pools = p.graph(
        "State pools by owner",
        "none",
        (
            f"sum by (group, state) ({_pages(STATE_FAMILY, OWNERS)})",
            "{{group}} {{state}}",
        ),
        (f"sum by (group) ({_capacity(STATE_FAMILY)})", "{{group}} capacity"),
    )
    return [by_owner, against_capacity, usage, state_pools]


def _tree_and_sessions() -> list:
    """The radix tree's side: root refs against expected, snapshots, session-held
    pages, and tree nodes and retained records."""
    root_refs = p.graph(
        "Root refs against expected",
        "none",
        (f"sum({p.series(n.ROOT_REFS, p.INSTANCE)})", "actual"),
        (f"sum({p.series(n.ROOT_REFS_EXPECTED, p.INSTANCE)})", "expected"),
    )
    snapshots = p.graph(
        "Snapshots per group",
        "none",
        (f"sum by (group) ({p.series(n.TREE_SNAPSHOTS, p.INSTANCE)})", "{{group}}"),
        (
            f"sum by (group) ({p.series(n.TREE_INTERIOR_SNAPSHOTS, p.INSTANCE)})",
            "{{group}} on interior nodes",
        ),
    )
    sessions = p.graph(
        "Session-held pages",
        "none",
        (f"sum by (group) ({p.series(n.SESSION_PAGES, p.INSTANCE)})", "{{group}}"),
        (f"sum({p.series(n.SESSIONS_LIVE, p.INSTANCE)})", "live sessions"),
    )
    tree = p.graph(
        "Tree nodes and retained records",
        "none",
        (f"sum({p.series(n.TREE_NODES, p.INSTANCE)})", "tree nodes"),
        (f"sum({p.series(n.RECORD_BYTES, p.INSTANCE)}) / 1024", "record KiB"),
    )
    return [root_refs, snapshots, sessions, tree]
