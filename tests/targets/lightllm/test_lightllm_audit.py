"""The probe of ``--engine lightllm-cache`` on hand-built structures, without a LightLLM checkout.

The structures carry LightLLM's attribute names (a tree of nodes with
``token_mem_index_value`` and ``ref_counter``, an allocator's ``mem_state``,
a request table, live requests with ``shared_kv_node``), so the reads, the
audit and the ``ProbeReport`` they make are the ones a live run gets. A
clean state passes; a planted orphan, double ownership, free-and-held slot,
ref mismatch, pending big page past a request's KV and root in the eviction
set are each found, as the finding kind whose detector owns it.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kvwatch.contracts import NOTICE, SEVERE, FindingKind, RootRefs
from kvwatch.gate.verdicts.detectors import for_signals
from kvwatch.targets import unit_audit
from kvwatch.targets.lightllm import slot_audit, state_read
from kvwatch.targets.lightllm.probe import InferProbe
from kvwatch.targets.lightllm.state_read import KV, REQ, SMALL, STATE, Holding, PoolView
from kvwatch.targets.lightllm.target import PROFILES, LightllmCacheTarget

KV_SIZE = 16


class Node:
    def __init__(self, parent: Node | None, slots: list[int], *, big: int | None = None):
        self.parent, self.children = parent, {}
        self.token_mem_index_value = torch.tensor(slots, dtype=torch.int64)
        start = parent.node_prefix_total_len if parent is not None else 0
        self.node_prefix_total_len = start + len(slots)
        self.ref_counter = 1 if parent is None else 0
        self.big_page_buffer_idx, self.small_page_buffer_idx = big, None
        if parent is not None:
            parent.children[len(parent.children)] = self

    def is_leaf(self) -> bool:
        return not self.children


class Buffers:
    def __init__(self, size: int, free: list[int]):
        self.size, self.keep_num, self.free_list = size + 2, 2, list(free)


def world(cache: str = "linear") -> SimpleNamespace:
    """A consistent state: a tree node [0:8) holding big page 0 anchors one live
    request, which holds KV slots 8-11 beyond it; slots 12-15 are free."""
    root = Node(None, [])
    node = Node(root, list(range(8)), big=0)
    req = SimpleNamespace(
        req_id=7,
        req_idx=0,
        shared_kv_node=node,
        cur_kv_len=12,
        paused=False,
        linear_att_len_to_big_page_id={} if cache == "linear" else None,
        tail_linear_att_small_page_buffer_id=None,
    )
    node.ref_counter, root.ref_counter = 1, 2  # the request's path ref, the root's pin + 1
    rows = torch.zeros((3, 32), dtype=torch.int64)
    rows[0, :12] = torch.arange(12)
    state = torch.arange(KV_SIZE)
    radix = SimpleNamespace(
        root_node=root,
        evict_tree_set=[node],
        _evict_tree_set=[node],
        _evict_tree_set_for_linear_att=[],
        tree_total_tokens_num=SimpleNamespace(arr=[8]),
        refed_tokens_num=SimpleNamespace(arr=[8]),
    )
    mem = SimpleNamespace(
        allocator=SimpleNamespace(mem_state=state, mark_start=12, mark_end=KV_SIZE, size=KV_SIZE),
        linear_att_big_page_buffers=Buffers(4, [1, 2, 3]),
    )
    parts = SimpleNamespace(
        radix=radix,
        mem=mem,
        req_manager=SimpleNamespace(
            req_list=SimpleNamespace(marks=[1, 0, 0]), req_to_token_indexs=rows
        ),
        small=Buffers(2, [0, 1]),
        ctx=SimpleNamespace(requests_mapping={7: req}),
        io=SimpleNamespace(cmds=[]),
    )
    return SimpleNamespace(
        parts=parts,
        linear=cache == "linear",
        iterations=5,
        outcomes=[],
        aborts=set(),
        observers=[],
        waiting=[],
        live=lambda: list(parts.ctx.requests_mapping.values()),
        req=req,
        node=node,
        root=root,
    )


def kinds(loop) -> dict[FindingKind, list[str]]:
    out: dict[FindingKind, list[str]] = {}
    for f in InferProbe(loop).report().findings:
        out.setdefault(f.kind, []).append(f.detail)
    return out


@pytest.mark.parametrize("cache", ["linear", "radix"])
def test_a_consistent_state_has_no_finding(cache):
    loop = world(cache)
    report = InferProbe(loop).report()
    assert report.findings == ()
    groups = [KV, REQ] if cache == "radix" else [STATE, SMALL, KV, REQ]
    assert list(report.groups) == groups
    kv = report.groups[KV]
    assert (kv.capacity, kv.free, kv.by_owner) == (16, 4, {"tree": 8, "request": 4})
    assert report.live_requests == 1 and report.step == 5
    assert report.registries == {}  # no object of a lightllm module here to walk


def test_a_slot_nobody_holds_is_an_orphan_named_by_its_last_holder():
    loop = world()
    probe = InferProbe(loop)
    probe.report()  # notes who holds what
    del loop.parts.ctx.requests_mapping[7]  # the request is gone, its slots 8-11 were not freed
    loop.parts.req_manager.req_list.marks[0] = 0
    loop.node.ref_counter, loop.root.ref_counter = 0, 1
    loop.parts.radix.refed_tokens_num.arr[0] = 0
    found = [f for f in probe.report().findings if f.kind is FindingKind.ORPHAN]
    assert [f.group for f in found] == [KV]
    assert found[0].pages == (8, 9, 10, 11)
    assert "8-11 (4 last held by request 7)" in found[0].detail


def test_a_slot_held_twice_is_double_owned_and_one_also_free_is_free_and_owned():
    loop = world()
    Node(loop.root, [9], big=None)  # a second holder of the request's slot 9
    loop.parts.radix.evict_tree_set.append(loop.root.children[1])
    loop.parts.radix._evict_tree_set.append(loop.root.children[1])
    loop.parts.radix.tree_total_tokens_num.arr[0] = 9
    loop.parts.mem.allocator.mark_start = 11  # slot 11 free while the request holds it
    loop.parts.mem.allocator.mem_state[11] = 11
    found = kinds(loop)
    assert (
        "lightllm.kv: unit 9 held by tree node [0:1) and request 7"
        in found[FindingKind.DOUBLE_OWNED]
    )
    assert any("11" in d and "request 7" in d for d in found[FindingKind.FREE_AND_OWNED])


def test_a_ref_count_other_than_the_anchored_requests_is_a_ref_mismatch():
    loop = world()
    loop.node.ref_counter = 2
    found = kinds(loop)
    assert found[FindingKind.REF_MISMATCH] == [
        "lightllm.kv: tree node [0:8) ref_counter 2, live requests anchored at or below it 1"
    ]


def test_pending_big_pages_past_a_requests_kv_are_an_orphan():
    """A chunked prefill paused or aborted after a big-page boundary (seed 002)."""
    loop = world()
    loop.parts.mem.linear_att_big_page_buffers.free_list.remove(1)
    loop.req.linear_att_len_to_big_page_id = {16: 1}
    found = kinds(loop)
    assert found[FindingKind.ORPHAN] == [
        "lightllm.state: request 7 (cur_kv_len 12) holds big pages {16: 1} pending past its "
        "KV: no insert takes them and nothing frees them"
    ]


def test_the_root_in_the_linear_eviction_set_breaks_the_tree():
    loop = world()
    loop.parts.radix._evict_tree_set.append(loop.root)
    found = kinds(loop)
    assert [d for d in found[FindingKind.TREE] if "root" in d] == [
        "lightllm.kv: the root is in _evict_tree_set (the tree is empty; the root must never "
        "be evicted)"
    ]


def test_the_linear_roots_drift_is_a_notice_the_plain_roots_is_judged():
    """LightLLM keeps a root ref per miss in its linear cache by design; the plain
    cache releases it, so there the count must be exact. The linear drift is not
    hidden: it is a notice, which no detector fails on and the run reports."""
    linear, plain = world("linear"), world("radix")
    linear.root.ref_counter = plain.root.ref_counter = 9
    report = InferProbe(linear).report()
    assert report.root_refs == RootRefs(actual=0, expected=0)
    (drift,) = report.findings
    assert (drift.kind, drift.severity) == (FindingKind.REF_MISMATCH, NOTICE)
    assert "ref_counter 9 is above 1 + 1 anchored: 7 refs" in drift.detail
    assert InferProbe(plain).report().root_refs == RootRefs(actual=9, expected=2)
    assert all(f.severity == SEVERE for f in InferProbe(plain).report().findings)
    plain.root.ref_counter = linear.root.ref_counter = 1  # below its pin + 1 anchored
    for loop in (linear, plain):
        assert (
            "the root's ref_counter 1 is below 1 + 1 anchored"
            in kinds(loop)[FindingKind.REF_MISMATCH][0]
        )


def test_the_pool_audit_alone():
    view = PoolView(
        group="g",
        universe=range(6),
        free=[0, 0, 5],
        holdings=[
            Holding(who="tree node [0:2)", owner="tree", rid=None, units=(1, 2)),
            Holding(who="request 3", owner="request", rid=3, units=(2, 7)),
        ],
    )
    found, counts = slot_audit.audit_pool(view, lambda group, unit: "request 3")
    by_kind = {f.kind: f for f in found}
    assert by_kind[FindingKind.ORPHAN].pages == (3, 4)
    assert [f.pages for f in found if f.kind is FindingKind.DOUBLE_OWNED] == [(0,), (2,), (7,)]
    assert counts == {"tree": 2, "request": 1}
    assert unit_audit.ranges([1, 2, 3, 7, 9, 10]) == "1-3, 7, 9-10"


def test_nodes_are_read_parents_first():
    loop = world()
    child = Node(loop.node, [12, 13])
    assert state_read.nodes_of(loop.parts.radix) == [loop.root, loop.node, child]
    assert state_read.path_units(child) == [*range(8), 12, 13]
    assert state_read.node_name(child) == "tree node [8:10)"


def test_the_target_is_judged_by_the_detectors_its_records_feed():
    assert for_signals(LightllmCacheTarget.signals) == (
        "allocator",
        "refcount",
        "tree",
        "requests",
        "quiescence",
    )
    assert list(PROFILES) == ["prefix-share", "chunked", "aborts", "pressure"]
