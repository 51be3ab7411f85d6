"""The probe contract: what the engine reports survives JSON both ways, and its
shape holds the fields CI and the docs rely on."""

from __future__ import annotations

import json
import subprocess
import sys

from kvwatch.contracts import OWNERSHIP, FindingKind, ProbeReport
from kvwatch.engine import Engine, EngineConfig, SamplingParams
from kvwatch.engine.cache.backends import build_cache
from kvwatch.engine.config import CacheConfig, PrefixCacheMode
from kvwatch.engine.faults import Fault
from kvwatch.engine.probe import QueueReport, take_probe

PARAMS = SamplingParams(max_tokens=4)


def round_trip(report: ProbeReport) -> ProbeReport:
    return ProbeReport.from_json(json.loads(json.dumps(report.to_json())))


def test_an_engine_probe_round_trips_through_json_in_both_modes():
    for mode in (PrefixCacheMode.RADIX, PrefixCacheMode.SLOTS):
        engine = Engine(EngineConfig(cache=CacheConfig(mode=mode)))
        engine.generate([[40 + i] * 70 for i in range(3)], PARAMS)
        sid = engine.open_session()
        engine.add_request([7] * 40, PARAMS, session_id=sid)
        engine.step()  # a request still running: queue, holders and bounds are non-trivial
        report = engine.probe()
        assert report.live_requests == 1 and report.live_sessions == 1
        assert (report.slots is not None) is (mode is PrefixCacheMode.SLOTS)
        assert round_trip(report) == report


def test_findings_keep_their_kind_through_json():
    cache = build_cache(CacheConfig(), faults=frozenset({Fault.ROOT_REF_LEAK_ON_MISS}))
    cache.match(cache.open([1, 2, 3, 4, 5]))  # a miss keeps the root's ref
    report = take_probe(cache.reads, 0, QueueReport(waiting=0, running=0, retracted=0, paused=0))
    assert [f.kind for f in report.findings] == [FindingKind.REF_MISMATCH]
    back = round_trip(report)
    assert back == report and back.findings[0].kind is FindingKind.REF_MISMATCH
    assert report.to_json()["findings"][0]["kind"] == "ref_mismatch"  # the wire value


def test_the_json_has_the_documented_fields():
    engine = Engine()
    data = engine.probe().to_json()
    assert {"step", "live_requests", "live_sessions", "groups", "root_refs", "findings"} <= set(
        data
    )
    group = data["groups"]["full.kv"]
    assert {"family", "capacity", "free", "by_owner"} <= set(group)
    owners = {"tree", "request", "session", "slot", "host", "host_evictable"}
    assert set(group["by_owner"]) == owners
    assert set(data["root_refs"]) == {"actual", "expected"}
    assert {"pinned", "limit", "exceeded"} <= set(data["bounds"]["full.kv"])
    assert {k.value for k in FindingKind} == {
        "orphan",
        "double_owned",
        "free_and_owned",
        "ref_mismatch",
        "tree",
        "slot_table",
        "listener",
        "registry",
        "abandoned",
        "starved",
        "overdue",
    }
    assert {k.value for k in OWNERSHIP} == {"orphan", "double_owned", "free_and_owned"}


def test_the_contract_module_loads_nothing_of_the_engine():
    code = "import sys, kvwatch.contracts; print(sorted(m for m in sys.modules if m.startswith(('torch', 'kvwatch.engine'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
