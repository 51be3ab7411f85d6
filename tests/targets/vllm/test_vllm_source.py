"""White-box vLLM's audit read as kvwatch probes: the detectors judge it as they
judge kvwatch's engine. Pure: audit answers as the engine core's probe sends
them (``GET /audit``), no vLLM needed."""

from __future__ import annotations

from kvwatch.contracts import FindingKind
from kvwatch.gate.verdicts.detectors import DETECTORS, RunRecord, Turn, for_signals
from kvwatch.targets.vllm.probe import GROUP, probe_report
from kvwatch.targets.vllm.target import VllmTarget

VLLM_DETECTORS = for_signals(VllmTarget.signals)


def answer(*findings: dict, referenced: int = 0, live: int = 0, step: int = 7) -> dict:
    """64 blocks in one pool (the null block among them)."""
    audit = {
        "findings": list(findings),
        "blocks_total": 64,
        "blocks_free": 63 - referenced,
        "blocks_referenced": referenced,
        "cached_hashes": 5,
        "live_requests": live,
        "holding_requests": live,
        "pools": 1,
    }
    return {"step": step, "waiting": 1, "running": live - 1 if live else 0, "audit": audit}


STALE = {
    "rule": "stale-hash-entry",
    "detail": "hash 1a2b3c@g0 maps to block 9, which carries no hash: a hit on it reads "
    "another prefix's KV",
    "blocks": [9],
    "requests": ["chatcmpl-7"],
    "hash": "1a2b3c@g0",
    "pool": 0,
}
ORPHAN = {
    "rule": "orphan-holder",
    "detail": "request chatcmpl-3 is not live but holds 2 blocks (2 held by no live request)",
    "blocks": [4, 5],
    "requests": ["chatcmpl-3"],
    "hash": None,
    "pool": 0,
}


def test_an_audit_reads_as_one_history_group_of_referenced_blocks():
    probe = probe_report(answer(referenced=12, live=3))
    group = probe.stats.groups[GROUP]
    assert (group.capacity, group.used, group.free) == (63, 12, 51)
    assert probe.live_requests == 3 and probe.stats.step == 7
    assert probe.stats.queue.waiting == 1 and probe.stats.queue.running == 2
    assert probe.stats.tree.nodes == 5 and probe.findings == () and probe.clean


def test_findings_keep_blocks_requests_and_hash_under_the_detector_that_owns_them():
    probe = probe_report(answer(STALE, ORPHAN))
    stale, orphan = probe.findings
    assert stale.kind is FindingKind.TREE and stale.pages == (9,) and stale.group == GROUP
    assert "chatcmpl-7" in stale.detail and stale.detail.count("1a2b3c@g0") == 1
    assert orphan.kind is FindingKind.ORPHAN and orphan.pages == (4, 5)
    assert "requests chatcmpl-3" in orphan.detail


def run_of(*barriers: dict, drained: dict | None = None) -> RunRecord:
    turns = tuple(Turn(turn=i, probes=(probe_report(a),)) for i, a in enumerate(barriers))
    last = probe_report(drained or answer())
    return RunRecord(turns=turns, warmup=2, baseline=probe_report(answer()), drained=last)


def verdicts(run: RunRecord) -> dict[str, str]:
    return {d: DETECTORS[d](run).verdict for d in VLLM_DETECTORS if d not in ("requests",)}


def test_clean_audits_pass_and_each_finding_fails_its_detector():
    clean = [answer(referenced=10 * i, live=i) for i in range(6)]
    assert set(verdicts(run_of(*clean)).values()) == {"pass", "skipped"}
    stale = run_of(*clean[:3], answer(STALE, referenced=30, live=3), *clean[4:])
    tree = DETECTORS["tree"](stale)
    assert tree.failed and tree.first_turn == 3 and "1a2b3c@g0" in tree.evidence[0].detail
    assert DETECTORS["allocator"](stale).verdict == "pass"
    refs = {"rule": "refcount", "detail": "block 2 has ref_cnt 2 but 1 holders", "blocks": [2]}
    assert DETECTORS["refcount"](run_of(*clean[:5], answer(refs, live=1))).failed
    assert not DETECTORS["allocator"](run_of(*clean[:5], answer(refs, live=1))).failed


def test_blocks_left_after_the_flush_fail_the_drain_rule_with_their_holder():
    clean = [answer(referenced=10 * i, live=i) for i in range(6)]
    leaked = run_of(*clean, drained=answer(ORPHAN, referenced=2))
    verdict = DETECTORS["allocator"](leaked)
    assert verdict.failed
    details = " | ".join(e.detail for e in verdict.evidence)
    assert "chatcmpl-3" in details and (4, 5) in [e.pages for e in verdict.evidence]
