"""One way out for a page: only ``CacheStorage`` (cache/storage.py) calls a pool's
``free`` or ``transfer``; every other module goes through its exits
(``free_pages``, ``free_groups``, ``transfer_pages``). The per-group classes
keep a holder's tables in step with them: ``SlidingWindowPages.free_swa_from``
and ``free_swa_behind`` take each page out of the holder's window as it goes."""

from __future__ import annotations

import ast

import numpy as np
import pytest
from cachesim import cache_config
from paths import PACKAGE

from kvwatch.engine.cache.failpoints import Site
from kvwatch.engine.cache.holder import Holder
from kvwatch.engine.cache.node import Tier
from kvwatch.engine.cache.owner import Owner, OwnerKind
from kvwatch.engine.cache.pool import OwnershipError
from kvwatch.engine.cache.sliding_window import SlidingWindowPages
from kvwatch.engine.cache.storage import CacheStorage
from kvwatch.engine.config import FULL_KV, SWA_KV

ENGINE = PACKAGE / "engine"
OWNER_OF_EXITS = ENGINE / "cache" / "storage.py"
POOL_EXITS = frozenset({"free", "transfer"})  # PagePool's methods that release or retag pages
REQ = Owner(OwnerKind.REQUEST, 1)
OTHER = Owner(OwnerKind.REQUEST, 2)


def pool_exits(source: str) -> list[tuple[int, str]]:
    """Every call of a method named ``free`` or ``transfer`` in ``source``, as
    (line, call text). Only pools have such methods in the engine, and the
    storage's own exits are named otherwise, so any receiver counts: a pool
    reached through ``pools[...]``, ``pool(...)`` or a local name alike."""
    return sorted(
        (node.lineno, ast.unparse(node))
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in POOL_EXITS
    )


def test_no_module_but_the_storage_frees_or_transfers_a_pools_pages():
    scanned, found = [], {}
    for path in sorted(ENGINE.rglob("*.py")):
        if path == OWNER_OF_EXITS:
            continue
        scanned.append(path.relative_to(PACKAGE).as_posix())
        if calls := pool_exits(path.read_text()):
            found[scanned[-1]] = calls
    assert {"engine/cache/base.py", "engine/cache/sessions.py"} <= set(scanned)
    assert {"engine/cache/commit.py", "engine/cache/slot_backend.py"} <= set(scanned)
    families = ("full_attention", "sliding_window", "linear_state", "holder_pages")
    assert {f"engine/cache/{name}.py" for name in families} <= set(scanned)
    assert not found, f"pages leave a pool outside CacheStorage: {found}"


def test_the_scan_sees_the_storages_own_calls():
    """The scan reads real code: the storage's exits do call the pools."""
    calls = [text for _, text in pool_exits(OWNER_OF_EXITS.read_text())]
    assert any(".free(" in t for t in calls) and any(".transfer(" in t for t in calls)


@pytest.mark.parametrize(
    "planted",
    [
        "cache._store.pools[FULL_KV].free(copies, holder.owner)",
        "self.store.pool(group, tier).transfer(ids, holder.owner, TREE_OWNER)",
        "swa = self.store.pools[SWA_KV]\nif dead:\n    swa.free(pages, holder.owner)",
        "def f(pool):\n    return pool.transfer(pages, a, b) or None",
    ],
)
def test_the_scan_catches_a_direct_call(planted):
    assert len(pool_exits(planted)) == 1


def test_the_scan_lets_the_storages_exits_through():
    clean = (
        "cache._store.free_pages(FULL_KV, copies, holder.owner)\n"
        "cache._store.transfer_pages(FULL_KV, pages, holder.owner, TREE_OWNER)\n"
        "self.store.free_groups(pend.pages, holder.owner, Tier.DEVICE)\n"
        "self.window.free_swa_from(holder, keep_len)\n"
        "n = pool.free_count\n"
    )
    assert pool_exits(clean) == []


# -- the exits' behaviour --------------------------------------------------------------
def storage_with_holder(swa_pages: int) -> tuple[CacheStorage, Holder]:
    config = cache_config(window=8, interval=16, page=4, full=16, swa=16, snapshots=4)
    store = CacheStorage(config)
    holder = Holder(id=1, owner=REQ, tokens=list(range(64)))
    holder.swa_pages = dict(enumerate(store.pools[SWA_KV].alloc(swa_pages, REQ).tolist()))
    return store, holder


def window_of(store: CacheStorage) -> SlidingWindowPages:
    return SlidingWindowPages(store, store.config)


def test_free_swa_from_frees_the_pages_starting_at_or_past_the_bound():
    store, holder = storage_with_holder(5)  # page j holds positions [4j, 4j + 4)
    window, ids = window_of(store), dict(holder.swa_pages)
    window.free_swa_from(holder, 9)  # page 2 holds 8..11: it keeps live tokens
    assert sorted(holder.swa_pages) == [0, 1, 2]
    pool = store.pools[SWA_KV]
    assert pool.free_count == 16 - 3
    assert [pool.owner_of(ids[j]) for j in (3, 4)] == [None, None]
    window.free_swa_from(holder, 8)
    assert sorted(holder.swa_pages) == [0, 1] and pool.owner_of(ids[2]) is None


def test_free_swa_behind_frees_the_pages_wholly_below_the_cutoff():
    store, holder = storage_with_holder(5)
    window, ids = window_of(store), dict(holder.swa_pages)
    window.free_swa_behind(holder, 11)  # page 2 holds 8..11: 11 is still in the window
    assert sorted(holder.swa_pages) == [2, 3, 4]
    assert [store.pools[SWA_KV].owner_of(ids[j]) for j in (0, 1, 2)] == [None, None, REQ]
    window.free_swa_behind(holder, 0)  # nothing behind: nothing changes
    assert sorted(holder.swa_pages) == [2, 3, 4] and store.pools[SWA_KV].free_count == 13


def test_the_exits_check_the_owner_and_change_nothing_on_a_wrong_one():
    store, _ = storage_with_holder(0)
    pool = store.pools[FULL_KV]
    pages = store.alloc(FULL_KV, 3, REQ, site=Site.ALLOCATE_PREFILL)
    tags = pool.owner_id.copy()
    with pytest.raises(OwnershipError):
        store.free_pages(FULL_KV, pages, OTHER)
    with pytest.raises(OwnershipError):
        store.transfer_pages(FULL_KV, pages, OTHER, REQ)
    assert pool.free_count == 13 and (pool.owner_id == tags).all()
    store.transfer_pages(FULL_KV, pages, REQ, OTHER)
    assert [pool.owner_of(p) for p in pages.tolist()] == [OTHER] * 3 and pool.free_count == 13
    store.free_groups({FULL_KV: pages[:1]}, OTHER, Tier.DEVICE)
    store.free_pages(FULL_KV, np.asarray(pages[1:]), OTHER)
    assert pool.free_count == 16
    with pytest.raises(OwnershipError):  # freed twice
        store.free_pages(FULL_KV, pages[:1], OTHER)
