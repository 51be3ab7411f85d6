"""The pieces of ``--engine sglang-cache`` that run without an SGLang wheel.

The stand-ins, the wheel cache, the layout and trait readers, the configuration
stand-in, the audit of one pool, the lock and counter checks, the registry walk,
the request counts, the flags that pick the target, and which detectors judge it.
``test_real_bugs_live.py`` runs the target on real releases.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvwatch.contracts import FindingKind
from kvwatch.gate.verdicts.detectors import for_signals
from kvwatch.targets import unit_audit
from kvwatch.targets.driver.drive import counts
from kvwatch.targets.driver.engine_loop import Outcome
from kvwatch.targets.select import TargetFlags, choose
from kvwatch.targets.sglang import (
    pool_audit,
    registry_walk,
    release_layout,
    wheel_fetch,
)
from kvwatch.targets.sglang.cache_views import Lock, NodeView
from kvwatch.targets.sglang.loop import SchedulerLoop
from kvwatch.targets.sglang.pool_holders import Holding
from kvwatch.targets.sglang.target import PROFILES, SglangCacheTarget
from kvwatch.targets.stand_ins import Stub, StubModule, defines


# -- which detectors, which profiles, which flags -------------------------------------------
def test_the_target_is_judged_by_the_detectors_its_records_feed():
    """Probes, registries and request counts: no heap (PyTorch's small-block pool
    reads as SGLang's), no replays (no model), no gauges (no server)."""
    assert for_signals(SglangCacheTarget.signals) == (
        "allocator",
        "refcount",
        "tree",
        "requests",
        "quiescence",
    )


def test_its_profiles_are_the_workloads():
    assert list(SglangCacheTarget("0.5.23").profiles()) == list(PROFILES)
    assert list(PROFILES) == [
        "agentic",
        "sessions",
        "aborts",
        "pressure",
        "priority",
        "abort-stages",
        "session-churn",
        "session-pressure",
    ]
    assert PROFILES["sessions"].workload.sessions and not PROFILES["aborts"].workload.sessions
    assert PROFILES["session-churn"].workload.sessions


def test_the_flags_pick_it(tmp_path):
    flags = TargetFlags(
        engine="sglang-cache", sglang_version="0.5.10rc0", sglang_cache="swa", page_size=4
    )
    target = choose(flags, tmp_path)
    assert isinstance(target, SglangCacheTarget)
    assert (target.version, target.cache, target.page_size) == ("0.5.10rc0", "swa", 4)
    default = choose(TargetFlags(engine="sglang-cache", sglang_version="0.5.23"), tmp_path)
    assert (default.cache, default.page_size) == ("radix", 1)


@pytest.mark.parametrize(
    "flags, message",
    [
        (dict(engine="sglang-cache"), "needs --sglang-version"),
        (dict(engine="sglang-cache", sglang_version=">=0.5"), "takes a release"),
        (dict(engine="sglang-cache", sglang_version="0.5.23", faults=("x",)), "no --inject"),
        (dict(sglang_version="0.5.23"), "goes with --engine sglang-cache"),
        (dict(engine="vllm", page_size=4), "--page-size goes with --engine sglang-cache"),
        (
            dict(engine="sglang-cache", sglang_version="0.5.23", sglang_cache="mamba", page_size=4),
            "--page-size 1 only",
        ),
        (dict(engine="sglang-cache", sglang_version="0.5.23", page_size=0), "must be >= 1"),
    ],
)
def test_flags_that_do_not_fit_are_usage_errors(tmp_path, flags, message):
    with pytest.raises(ValueError, match=message):
        choose(TargetFlags(**flags), tmp_path)


# -- stand-ins ------------------------------------------------------------------------------
def test_a_stub_is_inert_and_keeps_what_it_decorates():
    stub = Stub("x")
    assert not stub and len(stub) == 0 and list(stub) == [] and stub + 3 == 0
    assert stub.mode.EXTEND is stub.mode.EXTEND  # enum-like reads compare equal

    def f():
        return 1

    assert stub(f) is f and not stub(1, 2)
    with stub as inside:
        assert not inside


def test_a_stubbed_class_is_falsy_and_a_real_subclass_is_real():
    module = StubModule("sglang.fake")
    base = module.GpuMixin
    assert not base and not base()

    class Real(base):
        def own(self) -> int:
            return 2

    obj = Real()
    assert obj.own() == 2 and not obj.anything_else
    assert defines(Real, "own") and not defines(Real, "anything_else")


# -- the wheel cache ------------------------------------------------------------------------
@pytest.mark.parametrize("good", ["0.5.23", "0.5.10rc0", "0.5.4.post3", "1.0.0.dev2"])
def test_versions_are_single_releases(good):
    assert wheel_fetch.check_version(good) == good


@pytest.mark.parametrize("bad", ["", ">=0.5", "0.5.23 ", "latest", "0.5;x", "../0.5"])
def test_anything_else_is_refused(bad):
    with pytest.raises(ValueError):
        wheel_fetch.check_version(bad)


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("KVWATCH_CACHE", str(tmp_path / "k"))
    assert wheel_fetch.cache_dir() == tmp_path / "k" / "sglang"
    monkeypatch.delenv("KVWATCH_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert wheel_fetch.cache_dir() == tmp_path / "x" / "kvwatch" / "sglang"


def test_only_the_python_sources_of_a_wheel_are_extracted_and_kept(tmp_path, monkeypatch):
    folder = tmp_path / "sglang" / "9.9.9"
    folder.mkdir(parents=True)
    with zipfile.ZipFile(folder / "sglang-9.9.9-py3-none-any.whl", "w") as wheel:
        wheel.writestr("sglang/srt/a.py", "A = 1\n")
        wheel.writestr("sglang/srt/kernel.so", b"\0")
        wheel.writestr("sglang-9.9.9.dist-info/METADATA", "x")
    monkeypatch.setattr(wheel_fetch.subprocess, "run", None)  # no download: the wheel is there
    src = wheel_fetch.fetch("9.9.9", tmp_path / "sglang")
    assert sorted(p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file()) == [
        "sglang/srt/a.py"
    ]
    assert not list(folder.glob("*.whl"))  # only its sources are kept
    assert wheel_fetch.fetch("9.9.9", tmp_path / "sglang") == src  # the second time: as is
    assert [p.name for p in folder.iterdir() if p.name.startswith("src-")] == []


# -- reading a release ----------------------------------------------------------------------
def write(root: Path, module: str, text: str) -> None:
    path = root / (module.replace(".", "/") + ".py")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_roles_resolve_to_the_newest_layout_the_wheel_has(tmp_path):
    for role in release_layout.REQUIRED:
        write(tmp_path, release_layout.ROLES[role][0][0], "")
    write(tmp_path, "sglang.srt.mem_cache.session_aware_cache", "")  # the older layout only
    roles = release_layout.resolve(tmp_path)
    assert roles["session_cache"].module == "sglang.srt.mem_cache.session_aware_cache"
    assert "registry" not in roles
    (tmp_path / "sglang/srt/mem_cache/common.py").unlink()
    with pytest.raises(LookupError, match="common"):
        release_layout.resolve(tmp_path)
    assert release_layout.is_real("sglang.srt.session.streaming_session")
    assert not release_layout.is_real("sglang.srt.managers.scheduler")


# -- the audit ------------------------------------------------------------------------------
def held(owner: str, who: str, *units: int, rid: str | None = None) -> Holding:
    return Holding(owner=owner, who=who, units=units, rid=rid)


def audit(free, universe, holdings, last=lambda group, unit: f"holder of {unit}"):
    return pool_audit.audit_group("sglang.kv", free, set(universe), holdings, last)


def test_ranges_read_as_runs():
    assert unit_audit.ranges([9, 3, 4, 5, 12, 13]) == "3-5, 9, 12-13"
    assert unit_audit.ranges(range(0, 40, 2)).endswith("(+12 ranges)")


def test_a_clean_pool_has_no_findings_and_counts_its_owners():
    tree = held("tree", "tree node 3", 0, 1)
    found, by_owner = audit(
        [4, 5],
        range(6),
        [
            tree,
            held("request", "request r1 req_to_token row 0", 0, 1, 2, rid="r1"),
            held("session", "session s SessionSlot row 1", 3),
        ],
    )
    assert found == []
    assert dict(by_owner) == {"tree": 2, "request": 1, "session": 1}


def test_a_unit_nobody_holds_is_an_orphan_named_by_its_last_holder():
    found, _ = audit([0], range(4), [held("tree", "tree node 1", 1)])
    assert [f.kind for f in found] == [FindingKind.ORPHAN]
    assert found[0].pages == (2, 3)
    assert "2 units allocated but held by no request, session slot or tree node: 2-3" in (
        found[0].detail
    )
    assert "1 last held by holder of 2" in found[0].detail


def test_two_holders_outside_the_tree_or_two_tree_nodes_hold_twice():
    shared_prefix = [held("tree", "tree node 1", 0), held("request", "request a", 0)]
    assert audit([], [0], [*shared_prefix, held("request", "request b", 0)])[0] == []
    found, _ = audit([], [1], [held("request", "request a", 1), held("request", "request b", 1)])
    assert [f.kind for f in found] == [FindingKind.DOUBLE_OWNED]
    assert found[0].detail == "sglang.kv: unit 1 held by request a and request b"
    two_nodes, _ = audit([], [2], [held("tree", "tree node 1", 2), held("tree", "tree node 2", 2)])
    assert [f.kind for f in two_nodes] == [FindingKind.DOUBLE_OWNED]


def test_free_and_held_and_freed_twice_are_findings():
    found, _ = audit([0, 5, 5], range(6), [held("tree", "tree node 7", 0, 1, 2, 3, 4)])
    kinds = [f.kind for f in found]
    assert kinds == [FindingKind.DOUBLE_OWNED, FindingKind.FREE_AND_OWNED]
    assert "on the free list twice: 5" in found[0].detail
    assert "1 units free and held: 0 by tree node 7" in found[1].detail


def test_units_outside_the_pool_free_or_held_are_double_owned():
    """Page 0 is SGLang's padding page, never given out; 9 is past the allocator's last."""
    row = held("request", "request r1 req_to_token row 0", 1, 2, 3, 4, rid="r1")
    assert audit([], range(1, 5), [row]) == ([], {"request": 4})
    padding = held("request", "request r1 req_to_token row 0", 0, 1, 2, 3, 4, rid="r1")
    found, _ = audit([9], range(1, 5), [padding])
    assert [f.kind for f in found] == [FindingKind.DOUBLE_OWNED]
    assert found[0].detail == "sglang.kv: units outside the pool's 4 free or held: 0, 9"
    assert found[0].pages == (0, 9)


class Node:
    def __init__(self, parent: Node | None = None) -> None:
        self.parent = parent


def view(node, node_id: int, lock: int, *, mamba_lock=None) -> NodeView:
    return NodeView(
        node=node,
        id=node_id,
        full=None,
        swa=None,
        mamba=[1] if mamba_lock is not None else None,
        full_lock=lock,
        swa_lock=None,
        mamba_lock=mamba_lock,
    )


def test_lock_refs_must_equal_the_live_holders_path_locks():
    root = Node()
    a = Node(root)
    b = Node(a)
    locks = [Lock(who="request r1", node=b, mamba=True)]
    exact = [view(root, 0, 1), view(a, 1, 1), view(b, 2, 1, mamba_lock=1)]
    assert pool_audit.audit_locks(exact, locks, unified=True) == []
    drifted = [view(root, 0, 1), view(a, 1, 2), view(b, 2, 1, mamba_lock=0)]
    found = pool_audit.audit_locks(drifted, locks, unified=True)
    assert [f.detail for f in found] == [
        "sglang.kv: tree node 1 lock ref 2, live holders imply 1 (request r1)",
        "sglang.kv: tree node 2 mamba lock ref 0, live holders imply 1 (request r1)",
    ]
    assert {f.kind for f in found} == {FindingKind.REF_MISMATCH}


def test_the_trees_counters_must_match_its_nodes():
    n = NodeView(
        node=None,
        id=4,
        full=[10, 11, 12],
        swa=None,
        mamba=None,
        full_lock=0,
        swa_lock=None,
        mamba_lock=None,
    )
    root = view(Node(), 0, 1)
    ok = {"full.evictable": 3, "full.protected": 0}
    assert pool_audit.audit_counters([root, n], ok, "RadixCache") == []
    found = pool_audit.audit_counters([root, n], {**ok, "full.protected": 2}, "RadixCache")
    assert [f.detail for f in found] == [
        "sglang.kv: RadixCache full.protected is 2, the nodes hold 0"
    ]


def tree_node(node_id: int, tokens: list[int], lock: int) -> NodeView:
    return NodeView(
        node=None,
        id=node_id,
        full=tokens,
        swa=None,
        mamba=None,
        full_lock=lock,
        swa_lock=None,
        mamba_lock=None,
    )


def test_at_page_size_4_the_counters_must_match_the_whole_pages_the_nodes_keep():
    root = view(Node(), 0, 1)
    counters = {"full.evictable": 8, "full.protected": 4}
    whole = [root, tree_node(4, list(range(20, 28)), 0), tree_node(5, [8, 9, 10, 11], 1)]
    assert pool_audit.audit_counters(whole, counters, "RadixCache", page=4) == []
    # 6 tokens: all of page 5 and half of page 6, which the node pins whole
    partial = [root, tree_node(4, list(range(20, 26)), 0), tree_node(5, [8, 9, 10, 11], 1)]
    tokens = {**counters, "full.evictable": 6}
    assert pool_audit.audit_counters(partial, tokens, "RadixCache") == []  # page size 1
    found = pool_audit.audit_counters(partial, tokens, "RadixCache", page=4)
    assert [(f.kind, f.detail) for f in found] == [
        (
            FindingKind.TREE,
            "sglang.kv: RadixCache full.evictable is 6 tokens, the nodes cover 2 pages of 4 "
            "(8 tokens): tree node 4 holds 6 tokens on 2 pages",
        )
    ]
    # a counter a page off is the token recount's finding, at any page size
    off = pool_audit.audit_counters(whole, {**counters, "full.protected": 8}, "RadixCache", page=4)
    assert [f.detail for f in off] == [
        "sglang.kv: RadixCache full.protected is 8, the nodes hold 4"
    ]


# -- registries and request counts ----------------------------------------------------------
def sglang_class(name: str, **attrs):
    return type(name, (), {"__module__": "sglang.srt.fake", **attrs})


def test_the_walk_sizes_sglang_containers_and_bounds_the_declared_ones(monkeypatch):
    Tracker = sglang_class("UnifiedSessionRefTracker")
    Cache = sglang_class("Cache")
    fake = SimpleNamespace(_CLOSED_SESSION_TOMBSTONE_LIMIT=2)
    monkeypatch.setitem(registry_walk.sys.modules, "sglang.srt.fake", fake)
    tracker = Tracker()
    tracker._closed_session_ids = ["a", "b", "c"]
    cache = Cache()
    cache.slots = {"s1": [1, 2], "s2": [3]}
    cache.refs = tracker
    cache.outside = SimpleNamespace(hidden=[1])  # not SGLang's: not walked
    walked = registry_walk.walk({"tree_cache": cache})
    assert walked.sizes == {"tree_cache.slots": 2, "tree_cache.slots[*]": 3}
    assert walked.breaches == (
        "tree_cache.refs._closed_session_ids holds 3 entries, above the 2 "
        "UnifiedSessionRefTracker bounds it to",
    )


def test_requests_are_counted_as_their_clients_would():
    loop = object.__new__(SchedulerLoop)  # its statuses and how it names a failure
    loop.outcomes = [
        Outcome(rid="a", status="finished", step=3),
        Outcome(rid="b", status="aborted-in-queue", step=4),
        Outcome(rid="c", status="timed-out", step=5),
        Outcome(rid="d", status="aborted-by-sglang", step=6, why="out of memory"),
    ]
    got = counts(loop)
    assert got["status"] == {"2xx": 1, "4xx": 2} and got["failed"] == 1
    assert got["first_failures"] == [
        {"name": "d", "status": 0, "error": "SGLang aborted it at step 6: out of memory"}
    ]
    json.dumps(got)  # what the recorder's reports carry
