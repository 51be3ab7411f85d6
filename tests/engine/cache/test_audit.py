"""The audit's tree and ref checks: every broken link, shape, counter or ref
count is reported, and the same cache before the damage audits clean.

The damage is done by hand to a cache that a real turn sequence built: two
conversations over one shared prefix (a branch point), one of them still
running with its path locked. Each 20-token prompt commits to a node at 16
(an interval capture, superseded to a history-only anchor) and a leaf at 20::

    root ──[0, 8)──► branch ──[8, 16)──► ──[16, 20)──► done     (released: evictable leaf)
                            └─[8, 16)──► ──[16, 20)──► locked   (a running holder's lock)
"""

from __future__ import annotations

from typing import NamedTuple

import pytest
from cachesim import INT_LAYOUTS, SimRunner, cache_config, run_turn

from kvwatch.contracts import FindingKind
from kvwatch.engine.cache.audit import audit
from kvwatch.engine.cache.backends import build_cache
from kvwatch.engine.cache.base import CacheBase
from kvwatch.engine.cache.node import Node
from kvwatch.engine.cache.protocol import Handle, holder_of


class Built(NamedTuple):
    cache: CacheBase
    live: Handle
    branch: Node
    done: Node
    locked: Node


def built_cache() -> Built:
    config = cache_config(window=8, interval=16, page=4, full=64, swa=32, snapshots=8)
    cache = build_cache(config, INT_LAYOUTS)
    sim = SimRunner(cache)
    done = cache.open([*range(8), *range(100, 112)])
    cache.match(done)
    run_turn(sim, done, [], chunk=8, decode=[])
    cache.release(done, commit=True)
    live = cache.open([*range(8), *range(200, 212)])
    cache.match(live)
    run_turn(sim, live, [], chunk=8, decode=[])
    (branch,) = cache.view.tree.root.children.values()
    (done,) = cache.view.tree.evictable
    assert audit(cache.view).clean
    return Built(cache, live, branch, done, holder_of(live).lock_node)


def tree_problems(cache) -> list[str]:
    return [f.detail for f in audit(cache.view).findings if f.kind == FindingKind.TREE]


def test_the_built_cache_is_clean_and_shaped_as_drawn():
    b = built_cache()
    branch, done, locked = b.branch, b.done, b.locked
    assert holder_of(b.live).lock_node is locked
    assert branch.depth == 8 and len(branch.children) == 2
    assert done.depth == locked.depth == 20 and done.tokens[0] == 108
    assert (branch.refs, locked.refs, done.refs) == (1, 1, 0)
    assert done.is_leaf and locked.is_leaf


def test_a_child_pointing_at_another_parent_is_reported():
    cache, done = (b := built_cache()).cache, b.done
    done.parent = cache._store.tree.root
    assert any(f"node {done.id}: depth or parent link broken" in p for p in tree_problems(cache))


def test_a_child_listed_under_a_key_other_than_its_own_is_reported():
    cache, *_, done, _ = built_cache()
    parent = done.parent
    del parent.children[done.key]
    parent.children[(None, 7, 7, 7, 7)] = done
    assert any(f"node {done.id}: depth or parent link broken" in p for p in tree_problems(cache))


def test_a_wrong_depth_is_reported():
    cache, _, _, done, _ = built_cache()
    done.depth += 4
    assert any(f"node {done.id}: depth or parent link broken" in p for p in tree_problems(cache))


def test_tokens_that_do_not_fill_the_pages_are_reported():
    cache, _, _, done, _ = built_cache()
    done.tokens = done.tokens[:-1]
    problems = tree_problems(cache)
    assert any(f"node {done.id}: 3 tokens over 1 pages" in p for p in problems)


def test_an_extra_key_that_differs_from_the_parents_is_reported():
    cache, _, _, done, _ = built_cache()
    done.extra_key = "other"
    assert any("extra key differs" in p for p in tree_problems(cache))


def test_counters_that_disagree_with_the_nodes_are_reported():
    cache, *_ = built_cache()
    cache._store.tree.node_count += 1
    cache._store.tree.page_count -= 1
    problems = tree_problems(cache)
    assert any("node counter" in p for p in problems)
    assert any("page counter" in p for p in problems)


@pytest.mark.parametrize("damage", ["drop_unlocked_leaf", "add_locked_leaf"])
def test_an_evict_set_that_is_not_the_unlocked_leaves_is_reported(damage):
    cache, _, _, done, locked = built_cache()
    if damage == "drop_unlocked_leaf":
        cache._store.tree.evictable.discard(done)
        expected = f"node {done.id} is an unlocked leaf missing from the evict set"
    else:
        cache._store.tree.evictable.add(locked)
        expected = f"node {locked.id} is in the evict set but is not an unlocked non-root leaf"
    assert expected in tree_problems(cache)


def test_refs_on_a_node_no_holder_locks_are_reported():
    cache, _, _, done, _ = built_cache()
    done.refs = 1
    refs = [f.detail for f in audit(cache.view).findings if f.kind == FindingKind.REF_MISMATCH]
    assert refs == [f"node {done.id} (depth 20): refs 1/host 0, live holders imply 0/0"]


def test_a_missing_ref_on_a_locked_node_is_reported():
    """Only nodes holding refs and nodes on live holders' paths are compared:
    a node that dropped to zero refs under a live lock must still be caught."""
    cache, _, branch, _, _ = built_cache()
    branch.refs = 0
    refs = [f.detail for f in audit(cache.view).findings if f.kind == FindingKind.REF_MISMATCH]
    assert refs == [f"node {branch.id} (depth 8): refs 0/host 0, live holders imply 1/0"]
