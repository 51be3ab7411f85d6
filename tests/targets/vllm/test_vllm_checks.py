"""The white-box checks of ``targets/vllm/checks.py`` on stand-ins for vLLM's objects.

No vLLM here: the checks only read attributes, so a scheduler of plain objects
with vLLM's shapes (a request's ``block_hashes`` and hasher, each group's
``req_to_blocks``, the pool's blocks, the running list) is enough to plant
each broken state and a clean one beside it. ``tests/targets/vllm/test_vllm_audit.py``
runs the same checks on vLLM's own scheduler.
"""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

from kvwatch.contracts import FindingKind
from kvwatch.targets.vllm import checks as checks
from kvwatch.targets.vllm import liveness as liveness
from kvwatch.targets.vllm import scratch as scratch
from kvwatch.targets.vllm.manager_audit import KINDS
from kvwatch.targets.vllm.probe import probe_report

BS = 4  # tokens per block


def chain(tokens: list[int], start_hashes: list[bytes]) -> list[bytes]:
    """vLLM's hasher's shape: appends the hashes of the full blocks after those it has."""
    out, parent = [], start_hashes[-1] if start_hashes else b"root"
    for end in range(len(start_hashes) * BS + BS, len(tokens) + 1, BS):
        parent = hashlib.sha256(parent + repr(tokens[end - BS : end]).encode()).digest()
        out.append(parent)
    return out


def hasher(request) -> list[bytes]:
    return chain(list(request.all_token_ids), list(request.block_hashes))


def key(block_hash: bytes, group: int = 0) -> bytes:
    return block_hash + group.to_bytes(4, "big")


class Request(SimpleNamespace):
    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self.all_token_ids)


def request(rid: str, tokens: list[int], computed: int | None = None) -> Request:
    r = Request(
        request_id=rid,
        all_token_ids=list(tokens),
        block_hashes=[],
        _block_hasher=hasher,
        num_computed_tokens=len(tokens) if computed is None else computed,
        num_prompt_tokens=len(tokens),
        max_tokens=16,
        num_output_placeholders=0,
        status=SimpleNamespace(name="RUNNING"),
    )
    r.block_hashes = hasher(r)
    return r


class Stand:
    """A scheduler of one group over a pool of ``n`` blocks."""

    def __init__(self, n: int = 16) -> None:
        blocks = [SimpleNamespace(block_id=i, block_hash=None, is_null=i == 0) for i in range(n)]
        self.pool = SimpleNamespace(blocks=blocks)
        self.manager = SimpleNamespace(
            block_size=BS,
            block_pool=self.pool,
            req_to_blocks={},
            kv_cache_group_id=0,
            new_block_ids=[],
            num_cached_block={},
            kv_cache_spec=("full", BS),
        )
        coordinator = SimpleNamespace(single_type_managers=[self.manager], attention_groups=[])
        kv = SimpleNamespace(coordinator=coordinator, block_pool=self.pool)
        self.scheduler = SimpleNamespace(
            requests={}, running=[], kv_cache_manager=kv, max_num_scheduled_tokens=64
        )
        self.next_free = 1

    def admit(self, r: Request, hit: list[int] = ()) -> list[int]:
        """``r`` holds the blocks ``hit`` names, then new ones for the rest of its tokens;
        its full blocks carry its hashes."""
        ids = list(hit)
        while len(ids) * BS < r.num_tokens:
            ids.append(self.next_free)
            self.next_free += 1
        for i, block_id in enumerate(ids[: len(r.block_hashes)]):
            self.pool.blocks[block_id].block_hash = key(r.block_hashes[i])
        self.manager.req_to_blocks[r.request_id] = [self.pool.blocks[i] for i in ids]
        self.scheduler.requests[r.request_id] = r
        self.scheduler.running.append(r)
        return ids


def rules(found) -> list[str]:
    return [f.rule for f in found]


def test_every_rule_maps_to_a_finding_kind_and_so_to_a_detector():
    assert KINDS["request-hash-stale"] is FindingKind.TREE
    assert KINDS["hit-on-other-tokens"] is FindingKind.TREE
    assert KINDS["scratch-not-drained"] is FindingKind.REGISTRY
    assert KINDS["dead-request-key"] is FindingKind.REGISTRY
    assert KINDS["running-skipped"] is FindingKind.STARVED


def test_hashes_that_agree_with_the_tokens_pass_with_a_shared_prefix():
    stand = Stand()
    a = request("A", list(range(10)))
    b = request("B", [*range(8), 50, 51, 52])
    hit = stand.admit(a)[:2]
    stand.admit(b, hit=hit)
    assert checks.check_hashes(stand.scheduler) == []
    ledger = checks.HashLedger()
    assert ledger.observe(stand.scheduler) == [] and ledger.observe(stand.scheduler) == []


def test_a_session_that_replaced_a_token_but_kept_its_hash_is_stale_on_both_sides():
    """A stream's next input dropped the sampled token that filled block 0; the
    request's hash and the cached block still describe the old tokens."""
    stand = Stand()
    a = request("A", [1, 2, 3, 9])  # 9: the sampled token, completing block 0
    stand.admit(a)
    old = list(a.block_hashes)
    a.all_token_ids = [1, 2, 3, 7, 8]  # the session's new input replaces 9
    a.block_hashes = old  # kept, as the buggy rebuild keeps it
    found = checks.check_hashes(stand.scheduler)
    assert rules(found) == ["request-hash-stale", "block-hash-vs-tokens"]
    stale, block = found
    assert stale.requests == ("A",) and "block_hashes[0]" in stale.detail
    assert block.blocks == (1,) and "files this KV under other tokens" in block.detail
    a.block_hashes = hasher(SimpleNamespace(all_token_ids=a.all_token_ids, block_hashes=[]))
    stand.pool.blocks[1].block_hash = key(a.block_hashes[0])
    assert checks.check_hashes(stand.scheduler) == []


def test_more_hashes_than_tokens_and_a_cached_block_past_them_are_named():
    stand = Stand()
    a = request("A", list(range(8)))
    stand.admit(a)
    a.all_token_ids = a.all_token_ids[:5]
    found = checks.check_hashes(stand.scheduler)
    assert rules(found) == ["request-hash-stale", "block-beyond-tokens"]
    assert "2 block hashes, its tokens make 1" in found[0].detail
    assert found[1].blocks == (2,)


def test_one_block_held_with_two_prefixes_is_shared_and_a_later_hit_on_other_tokens():
    stand = Stand()
    a = request("A", [1, 2, 3, 4, 5])
    ledger = checks.HashLedger()
    stand.admit(a)
    assert ledger.observe(stand.scheduler) == []
    b = request("B", [1, 2, 3, 8, 6])  # another prefix, but handed A's block 1
    b.block_hashes = list(a.block_hashes)  # its hashes say A's tokens: a hit
    stand.admit(b, hit=[1])
    found = checks.check_hashes(stand.scheduler)
    assert "shared-block-tokens" in rules(found)
    shared = next(f for f in found if f.rule == "shared-block-tokens")
    assert shared.requests == ("A", "B") and shared.blocks == (1,)
    hit = ledger.observe(stand.scheduler)
    assert rules(hit) == ["hit-on-other-tokens"] and hit[0].requests == ("A", "B")
    assert ledger.observe(stand.scheduler) == []  # reported once


def test_the_ledger_forgets_a_block_whose_hash_changed():
    stand = Stand()
    a = request("A", [1, 2, 3, 4])
    stand.admit(a)
    ledger = checks.HashLedger()
    ledger.observe(stand.scheduler)
    assert len(ledger.seen) == 1
    stand.pool.blocks[1].block_hash = None  # evicted
    ledger.observe(SimpleNamespace(**{**vars(stand.scheduler), "requests": {}}))
    assert ledger.seen == {}


def test_scratch_left_at_idle_over_the_pool_and_dead_request_keys_are_found():
    stand = Stand(n=8)
    assert scratch.check_scratch(stand.scheduler) == []
    stand.manager.new_block_ids.extend([3, 4])
    found = scratch.check_scratch(stand.scheduler)
    assert rules(found) == ["scratch-not-drained"] and found[0].blocks == (3, 4)
    assert "managers[0].new_block_ids holds 2 entries with no live request" in found[0].detail
    stand.admit(request("A", [1, 2]))  # busy: entries of this step are fine
    assert scratch.check_scratch(stand.scheduler) == []
    stand.manager.new_block_ids.extend(range(8))
    assert rules(scratch.check_scratch(stand.scheduler)) == ["scratch-over-pool"]
    stand.manager.new_block_ids.clear()
    stand.manager.num_cached_block.update({"A": 1, "gone": 2})
    (dead,) = scratch.check_scratch(stand.scheduler)
    assert dead.rule == "dead-request-key" and dead.requests == ("gone",)


def test_tables_the_audit_owns_and_config_containers_are_not_scratch():
    stand = Stand(n=8)
    stand.manager.req_to_blocks["gone"] = [stand.pool.blocks[2]]  # orphan-holder's
    stand.manager.kv_cache_spec = [("layers.0", 4)]
    stand.scheduler.kv_cache_manager.coordinator.attention_groups = [("spec", "backend")]
    assert scratch.check_scratch(stand.scheduler) == []
    sizes = scratch.registries(stand.scheduler)
    assert sizes["kv_cache_manager.coordinator.managers[0].req_to_blocks"] == 1
    assert sizes["kv_cache_manager.coordinator.managers[0].new_block_ids"] == 0


def step(tracker, stand, scheduled: dict, preempted=(), hide=()):
    """One schedule(): the tracker before and after it; ``hide`` leaves running."""
    tracker.before(stand.scheduler)
    for rid in preempted:
        stand.scheduler.requests[rid].status = SimpleNamespace(name="PREEMPTED")
    stand.scheduler.running = [
        r for r in stand.scheduler.running if r.request_id not in (*preempted, *hide)
    ]
    out = SimpleNamespace(
        num_scheduled_tokens=scheduled,
        preempted_req_ids=set(preempted),
        total_num_scheduled_tokens=sum(scheduled.values()),
    )
    return tracker.after(stand.scheduler, out)


def decoding(stand, *names):
    for name in names:
        r = request(name, list(range(5)), computed=4)  # one token to compute
        stand.admit(r)


def test_every_running_request_scheduled_or_preempted_is_live():
    stand, tracker = Stand(), liveness.LivenessTracker()
    decoding(stand, "X", "Y", "Z")
    assert step(tracker, stand, {"X": 1, "Y": 1, "Z": 1}) == []
    # Y could not get a block and preempted itself: the walk ended there, before Z
    assert step(tracker, stand, {"X": 1}, preempted=("Y",)) == []


def test_a_request_passed_over_after_a_victim_left_the_list_is_skipped():
    """PR 49206's shape: X, skipped this step, is the victim; the walk's cursor
    stepped over Z, which runs, holds blocks and had budget left."""
    stand, tracker = Stand(), liveness.LivenessTracker(bound=2)
    decoding(stand, "X", "Y", "Z")
    (found,) = step(tracker, stand, {"Y": 1}, preempted=("X",))
    assert found.rule == "running-skipped" and found.requests == ("Z",)
    assert "1 tokens to compute" in found.detail and "preempted this step: X" in found.detail
    for _ in range(2):
        step(tracker, stand, {"Y": 1})
    assert "running-starved" in rules(step(tracker, stand, {"Y": 1}))


def test_no_budget_left_or_nothing_to_compute_is_not_a_skip():
    stand, tracker = Stand(), liveness.LivenessTracker()
    decoding(stand, "X", "Y")
    stand.scheduler.max_num_scheduled_tokens = 1
    assert step(tracker, stand, {"X": 1}) == []
    stand.scheduler.max_num_scheduled_tokens = 64
    stand.scheduler.requests["Y"].num_computed_tokens = 5  # nothing left to compute
    assert step(tracker, stand, {"X": 1}) == []


def test_check_findings_read_as_probe_findings_under_their_detectors():
    stand = Stand(n=8)
    stand.manager.new_block_ids.extend([3])
    found = [vars(f) for f in scratch.check_scratch(stand.scheduler)]
    audit = {
        "findings": [],
        "blocks_total": 8,
        "blocks_free": 7,
        "blocks_referenced": 0,
        "cached_hashes": 0,
        "live_requests": 0,
        "holding_requests": 0,
    }
    answer = {"step": 3, "audit": audit, "checks": found, "registries": {"a.b": 1}}
    probe = probe_report(answer)
    (f,) = probe.findings
    assert f.kind is FindingKind.REGISTRY and f.pages == (3,)
    assert f.detail.startswith("scratch-not-drained: ") and probe.registries == {"a.b": 1}


def test_a_finding_keeps_its_identity_while_its_counts_move():
    def orphan(alone: int) -> dict:
        detail = (
            f"request chatcmpl-3 is not live but holds 2 blocks ({alone} held by no live request)"
        )
        return {
            "rule": "orphan-holder",
            "detail": detail,
            "blocks": [4, 5],
            "requests": ["chatcmpl-3"],
            "hash": None,
            "pool": 0,
            "subject": "request chatcmpl-3",
        }

    audit = {
        "blocks_total": 8,
        "blocks_free": 5,
        "blocks_referenced": 2,
        "cached_hashes": 0,
        "live_requests": 0,
        "holding_requests": 1,
    }
    (before,) = probe_report({"step": 1, "audit": {**audit, "findings": [orphan(2)]}}).findings
    (after,) = probe_report({"step": 9, "audit": {**audit, "findings": [orphan(1)]}}).findings
    assert before.detail != after.detail and before.identity == after.identity
    assert before.key == "orphan-holder: request chatcmpl-3"
    scratch = {"rule": "scratch-not-drained", "detail": "x holds 3 entries", "blocks": [1]}
    (grown,) = probe_report({"step": 9, "audit": {**audit, "findings": [scratch]}}).findings
    assert grown.key == ""  # its count is the finding: the detail says it


def test_the_scheduler_drivers_record_reads_as_a_run_the_detectors_judge():
    from kvwatch.gate.verdicts.detectors import DETECTORS
    from kvwatch.targets.vllm.scheduler_target import to_record

    def probe(step: int, *checks: dict) -> dict:
        audit = {
            "findings": [],
            "blocks_total": 8,
            "blocks_free": 7,
            "blocks_referenced": 0,
            "cached_hashes": 0,
            "live_requests": 0,
            "holding_requests": 0,
        }
        return {"step": step, "audit": audit, "checks": list(checks), "registries": {"x": 0}}

    skipped = {"rule": "running-skipped", "detail": "request Z was not scheduled", "blocks": []}
    counts = {"status": {"2xx": 4}, "failed": 0, "broken_turns": 0}
    data = {
        "vllm": "0.27.1",
        "baseline": probe(0),
        "turns": [
            {
                "turn": 0,
                "probes": [probe(3, skipped), probe(9)],
                "conversations": 4,
                "context_tokens": 60,
                "at": 1.0,
                "requests": counts,
            },
        ],
        "drained": probe(12),
        "requests": counts,
        "error": None,
    }
    record = to_record(data, warmup=2)
    assert [len(t.probes) for t in record.turns] == [2] and record.requests.requests == 4
    verdict = DETECTORS["requests"](record)
    assert verdict.failed and verdict.first_turn == 0 and "request Z" in verdict.evidence[0].detail
    broke = to_record({**data, "turns": [], "error": "TimeoutError: ..."}, warmup=2)
    assert broke.error.startswith("vLLM 0.27.1's scheduler run broke: TimeoutError")
