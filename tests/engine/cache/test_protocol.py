"""The cache's contracts: the scheduler and runner call only ``PrefixCache``, prefix
waits only ``BranchPromises``, the probe only ``AuditableCache``; each mode is one
backend, chosen once; events reach listeners only after the mutation that caused
them is complete."""

from __future__ import annotations

import ast
import dataclasses

import pytest
from cachesim import INT_LAYOUTS, SimRunner, cache_config, run_turn
from paths import PACKAGE as ROOT

from kvwatch.engine.cache.audit import audit
from kvwatch.engine.cache.backends import BACKENDS, NoPrefixCache, build_cache
from kvwatch.engine.cache.full_backend import FullAttentionPrefixCache
from kvwatch.engine.cache.protocol import (
    AuditableCache,
    BranchPromises,
    PrefixCache,
    ServedCache,
)
from kvwatch.engine.cache.radix_backend import RadixPrefixCache
from kvwatch.engine.cache.slot_backend import SlotPrefixCache
from kvwatch.engine.config import PrefixCacheMode
from kvwatch.engine.events import EventBus, NodeEvicted, SnapshotReleased, SnapshotTaken

CONFIG = cache_config(window=8, interval=8, page=4, full=24, swa=32, snapshots=12)


def members(*protocols: type) -> set[str]:
    return {
        name
        for protocol in protocols
        for klass in protocol.__mro__
        for name in vars(klass)
        if not name.startswith("_")
    }


PROTOCOL = members(PrefixCache) | {"page_size"}
# (file, the name it holds the backend by) -> the contract that name may use
CALLERS = {
    ("engine/scheduler.py", "cache"): PROTOCOL,
    ("engine/scheduler.py", "branches"): members(BranchPromises),
    ("engine/runner.py", "cache"): PROTOCOL,
    ("engine/prefix_wait.py", "branches"): members(BranchPromises),
    ("engine/probe.py", "cache"): members(AuditableCache),
}


def members_used(source: str, holder: str = "cache") -> set[str]:
    """Attributes read off ``self.<holder>`` or a name ``<holder>``, in ``source``."""
    used = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        name = getattr(base, "id", None) or getattr(base, "attr", None)
        if name == holder and isinstance(base, ast.Name | ast.Attribute):
            used.add(node.attr)
    return used


def test_each_caller_uses_only_the_contract_it_is_handed():
    for (path, holder), allowed in CALLERS.items():
        used = members_used((ROOT / path).read_text(), holder)
        assert used, f"{path}: no {holder} calls found; the check reads the wrong names"
        assert used <= allowed, f"{path} reaches past its contract: {sorted(used - allowed)}"


def test_the_contracts_share_no_member():
    """The scheduler's calls hold neither the audit nor the branch promises."""
    scheduler, branches, audit_view = PROTOCOL, members(BranchPromises), members(AuditableCache)
    assert not scheduler & branches and not scheduler & audit_view and not branches & audit_view
    assert {"probe", "usage", "structure"} <= audit_view
    assert {"promise", "promised_by", "kept_on_path"} <= branches


def test_the_protocol_check_catches_a_reach_through():
    planted = (
        "def f(self):\n"
        "    return self.cache.tree.walk(x) or self.cache.promises or self.cache.probe(0)\n"
    )
    assert members_used(planted) - PROTOCOL == {"tree", "promises", "probe"}


def test_no_mode_branch_outside_the_backends():
    """Which mode runs is decided once, in ``build_cache``; the slot table is
    the slot backend's alone."""
    allowed_mode = {"engine/config.py", "engine/cache/backends.py"}
    slot_modules = {"engine/cache/slot_backend.py", "engine/cache/slots.py", "engine/config.py"}
    for path in sorted((ROOT / "engine").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        if rel not in allowed_mode:
            assert "PrefixCacheMode" not in names and "mode" not in attrs, rel
            assert "radix" not in attrs, f"{rel} asks whether the cache is a radix cache"
        if rel not in slot_modules:
            assert "slots" not in attrs, f"{rel} reaches for the slot table"


@pytest.mark.parametrize(
    "mode, backend",
    [
        (PrefixCacheMode.RADIX, RadixPrefixCache),
        (PrefixCacheMode.SLOTS, SlotPrefixCache),
        (PrefixCacheMode.OFF, NoPrefixCache),
    ],
)
def test_each_mode_builds_its_backend_once(mode, backend):
    config = dataclasses.replace(CONFIG, mode=mode)
    cache = build_cache(config, INT_LAYOUTS)
    assert type(cache) is backend and isinstance(cache, PrefixCache)
    assert set(BACKENDS) == set(PrefixCacheMode)


def test_a_backend_offers_its_contract_and_nothing_else():
    """The façade is ``ServedCache``: what the engine, its scheduler and runner
    call, the two parts it hands out (``branches``, ``reads``), the read-only
    ``view`` and the failpoint schedule. Its parts stay private."""
    served = members(ServedCache) | {"page_size"}
    assert {"branches", "reads", "view", "failpoints", "end_turn"} <= served
    assert not served & {"store", "working", "holders", "tree", "events", "promises"}
    backends = [build_cache(dataclasses.replace(CONFIG, mode=mode)) for mode in PrefixCacheMode]
    for cache in [*backends, FullAttentionPrefixCache(CONFIG, INT_LAYOUTS)]:
        public = {name for name in dir(cache) if not name.startswith("_")}
        assert public == served, f"{type(cache).__name__}: {sorted(public ^ served)}"
    assert len(served) <= 25


def test_a_handle_only_reads_progress():
    cache = build_cache(CONFIG, INT_LAYOUTS)
    h = cache.open([*range(20)])
    cache.match(h)
    SimRunner(cache).compute(h, 9)
    assert (h.cached_len, h.computed_len, h.allocated_len) == (0, 9, 9)
    for internal in ("tokens", "full_pages", "lock_node", "pending", "working"):
        assert not hasattr(h, internal), internal
    with pytest.raises(dataclasses.FrozenInstanceError):
        h.computed_len = 0


def test_listeners_see_the_cache_only_between_mutations():
    """A listener that audits the cache on every eviction and snapshot event
    finds it consistent: the events arrive after the change is complete (an
    evicted leaf is out of the tree, a taken snapshot is attached)."""
    bus = EventBus()
    cache = build_cache(CONFIG, INT_LAYOUTS, events=bus)
    sim, seen, dirty = SimRunner(cache), [], []

    def check(event) -> None:  # a raising listener is isolated: record, don't raise
        seen.append(type(event).__name__)
        if findings := audit(cache.view).findings:
            dirty.append((type(event).__name__, findings[0].detail))

    for event_type in (NodeEvicted, SnapshotTaken, SnapshotReleased):
        bus.subscribe(event_type, check)
    for i in range(12):  # more conversations than full.kv holds: eviction runs
        h = cache.open([100 * i + t for t in range(20)])
        cache.match(h)
        run_turn(sim, h, [], chunk=8, decode=[1, 2, 3])
        cache.release(h, commit=True)
    assert {"NodeEvicted", "SnapshotTaken"} <= set(seen)
    assert not dirty, dirty[:3]
    assert not bus.failures


def test_a_raising_listener_leaves_the_cache_consistent():
    bus = EventBus()
    cache = build_cache(CONFIG, INT_LAYOUTS, events=bus)
    sim = SimRunner(cache)

    def broken(event) -> None:
        raise RuntimeError("a telemetry bug")

    for event_type in (NodeEvicted, SnapshotTaken, SnapshotReleased):
        bus.subscribe(event_type, broken)
    for i in range(12):
        h = cache.open([100 * i + t for t in range(20)])
        cache.match(h)
        run_turn(sim, h, [], chunk=8, decode=[1, 2, 3])
        cache.release(h, commit=True)
    assert audit(cache.view).clean
    assert cache.view.tree.node_count > 0
    assert sum(bus.failures.values()) > 0
