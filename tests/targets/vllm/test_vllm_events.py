"""vLLM's KV cache events against the block pool (``targets/vllm/event_ledger.py``), on
hand-made events and a pool of plain objects with vLLM's shapes: no vLLM here.
``test_vllm_layouts_live.py`` plants the same faults in vLLM's own ``BlockPool``."""

from __future__ import annotations

from dataclasses import asdict
from types import SimpleNamespace

from kvwatch.contracts import FindingKind
from kvwatch.targets.vllm.event_ledger import EventLedger, pool_keys
from kvwatch.targets.vllm.manager_audit import KINDS
from kvwatch.targets.vllm.probe import probe_report


class BlockStored(SimpleNamespace):
    pass


class BlockRemoved(SimpleNamespace):
    pass


class AllBlocksCleared(SimpleNamespace):
    pass


def h(n: int) -> bytes:
    return bytes([n]) * 8


def stored(*ns: int, group: int = 0) -> BlockStored:
    return BlockStored(block_hashes=[h(n) for n in ns], group_idx=group)


def removed(*ns: int, group: int = 0) -> BlockRemoved:
    return BlockRemoved(block_hashes=[h(n) for n in ns], group_idx=group)


class Pool:
    """A block pool's prefix index: ``cached_block_hash_to_block._cache`` (a key maps to
    a block, or to a dict of blocks when several carry it), keys with a 4-byte group id."""

    def __init__(self) -> None:
        self.cached_block_hash_to_block = SimpleNamespace(_cache={})

    def index(self, n: int, *block_ids: int, group: int = 0) -> Pool:
        blocks = {b: SimpleNamespace(block_id=b) for b in block_ids}
        value = next(iter(blocks.values())) if len(blocks) == 1 else blocks
        self.cached_block_hash_to_block._cache[h(n) + group.to_bytes(4, "big")] = value
        return self

    def drop(self, n: int, group: int = 0) -> Pool:
        del self.cached_block_hash_to_block._cache[h(n) + group.to_bytes(4, "big")]
        return self


def rules(found) -> list[str]:
    return [f.rule for f in found]


def test_each_event_rule_maps_to_the_detector_that_owns_it():
    assert KINDS["event-removed-unstored"] is FindingKind.REF_MISMATCH
    assert KINDS["event-stored-not-held"] is FindingKind.TREE
    assert KINDS["event-unannounced"] is FindingKind.TREE


def test_a_stream_that_tells_every_store_and_removal_equals_the_pool():
    ledger, pool = EventLedger(), Pool().index(1, 4).index(2, 5)
    assert ledger.take([stored(1, 2)]) == [] and ledger.check([pool]) == []
    assert ledger.take([removed(2), stored(3)]) == []
    assert ledger.check([pool.drop(2).index(3, 6)]) == []
    assert ledger.take([AllBlocksCleared()]) == [] and ledger.check([Pool()]) == []
    totals = ledger.totals()
    assert totals["keys stored"] == 3 and totals["keys removed"] == 1
    assert totals["AllBlocksCleared"] == 1 and totals["keys held"] == 0


def test_one_hash_on_two_blocks_takes_two_stores_and_stays_after_one_removal():
    """vLLM does not de-duplicate: two blocks may carry one hash, each stored and
    removed on its own."""
    ledger, pool = EventLedger(), Pool().index(1, 4, 7)
    ledger.take([stored(1), stored(1)])
    assert ledger.check([pool]) == []
    ledger.take([removed(1)])
    assert ledger.check([pool.drop(1).index(1, 7)]) == []


def test_a_removal_with_no_store_and_a_second_removal_are_caught():
    ledger = EventLedger()
    found = ledger.take([removed(9)])
    assert rules(found) == ["event-removed-unstored"] and "removed with no store" in found[0].detail
    ledger.take([stored(1)])
    found = ledger.take([removed(1), removed(1)])
    assert rules(found) == ["event-removed-unstored"]
    assert ledger.check([Pool()]) == []  # the balance stays at zero, not below


def test_a_removal_never_sent_leaves_the_stream_holding_what_the_pool_dropped():
    ledger = EventLedger()
    ledger.take([stored(1, 2)])
    found = ledger.check([Pool().index(2, 5)])
    assert rules(found) == ["event-stored-not-held"]
    assert "holds it on 1 block(s), the pool's prefix index on 0" in found[0].detail
    assert found[0].subject == f"{h(1)[:6].hex()}@g0"


def test_a_store_never_sent_leaves_the_pool_holding_what_the_stream_never_told():
    ledger = EventLedger()
    ledger.take([stored(1)])
    found = ledger.check([Pool().index(1, 4).index(3, 8, group=1)])
    assert rules(found) == ["event-unannounced"] and found[0].blocks == (8,)
    assert "(group 1)" in found[0].detail


def test_a_removal_sent_while_another_block_still_carries_the_hash_is_caught():
    ledger = EventLedger()
    ledger.take([stored(1), removed(1)])
    assert rules(ledger.check([Pool().index(1, 7)])) == ["event-unannounced"]


def test_groups_are_apart_and_the_pools_hash_is_converted_as_the_events_carry_it():
    def to_int(raw: bytes) -> int:
        return int.from_bytes(raw, "big") & ((1 << 64) - 1)

    ledger = EventLedger(to_int)
    event = BlockStored(block_hashes=[to_int(h(1))], group_idx=1)
    ledger.take([event])
    assert ledger.check([Pool().index(1, 4, group=1)]) == []
    assert rules(ledger.check([Pool().index(1, 4, group=0)])) == [
        "event-unannounced",  # group 0 holds what the stream never told
        "event-stored-not-held",  # group 1 holds nothing the stream told
    ]
    assert pool_keys(Pool().index(1, 4, 5), to_int) == {(0, to_int(h(1))): [4, 5]}


def test_event_findings_read_as_probes_under_their_detectors():
    ledger = EventLedger()
    found = ledger.take([removed(3)]) + ledger.check([Pool().index(2, 6)])
    audit = {
        "findings": [],
        "blocks_total": 8,
        "blocks_free": 7,
        "blocks_referenced": 0,
        "cached_hashes": 1,
        "live_requests": 0,
        "holding_requests": 0,
        "pools": 1,
    }
    checks = [asdict(f) for f in found]
    probe = probe_report({"step": 1, "waiting": 0, "running": 0, "audit": audit, "checks": checks})
    assert [f.kind for f in probe.findings] == [FindingKind.REF_MISMATCH, FindingKind.TREE]
    assert probe.findings[1].pages == (6,)
