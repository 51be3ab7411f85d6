"""The gate against real vLLM (its CPU build): black-box, and white-box with
kvwatch's probe in the engine core (``kvwatch gate --engine vllm``).

``make test-vllm`` builds vLLM's venv and points ``KVWATCH_VLLM_PYTHON`` at
it; without that these skip. The model is built here (``tinymodel.py``): no
model can be downloaded. The leak is vLLM's own ``KVCacheManager.free``
skipping every fourth request, planted in the engine core by kvwatch's vLLM
plugin; nothing in the gate knows that. The white-box gate is shown a bug
no usage gauge can show: a prefix-hash entry left on a block that was
handed out again (silent corruption).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from kvwatch.gate.verdicts.detectors import for_signals
from kvwatch.targets.vllm.api_server import SERVED_NAME, VllmServer, build_tiny_model
from kvwatch.targets.vllm.target import VllmTarget

VLLM_DETECTORS = for_signals(VllmTarget.signals)

PYTHON = os.environ.get("KVWATCH_VLLM_PYTHON")
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.e2e,
    pytest.mark.skipif(not PYTHON, reason="needs vLLM's venv: run `make test-vllm`"),
]
PROFILES = ("agentic-trie", "abort-storm", "slot-cache", "bad-input")
CONCURRENCIES = (1, 2, 4, 8)
PLANTED = "kvwatch: fault free-skipped planted"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return build_tiny_model(PYTHON, tmp_path_factory.mktemp("model") / "tiny")


def black_box_gate(server: VllmServer, out: Path) -> tuple[int, dict, str]:
    cmd = [
        *(sys.executable, "-m", "kvwatch", "gate", "--out", str(out), "--no-report"),
        *("--target", server.url, "--metrics-url", server.metrics_url),
        *("--gauges", "vllm", "--model", SERVED_NAME, "-c", "1,2,4,8"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    summary = json.loads((out / "summary.json").read_text())
    return proc.returncode, summary, proc.stderr


def audit(server: VllmServer) -> dict:
    """The engine core's audit of its KV cache manager, once the load is over."""
    answer = httpx.get(f"{server.probe_url}/audit", timeout=60)
    answer.raise_for_status()
    return answer.json()["audit"]


def test_a_clean_vllm_passes_the_black_box_gate(tmp_path, model):
    with VllmServer(PYTHON, model, tmp_path / "vllm.log", probe=True) as server:
        code, summary, err = black_box_gate(server, tmp_path / "out")
        after = audit(server)
        flushed = httpx.post(f"{server.probe_url}/flush", timeout=60).json()["flushed"]
        emptied = audit(server)
    assert code == 0, err[-3000:]
    assert after["findings"] == [] and after["holding_requests"] == 0
    assert flushed and emptied["cached_hashes"] == 0
    assert emptied["blocks_free"] == emptied["blocks_total"] - 1  # all but the null block
    assert PLANTED not in (tmp_path / "vllm.log").read_text()
    runs = summary["runs"]
    assert [(r["profile"], r["concurrency"]) for r in runs] == [
        (p, c) for p in PROFILES for c in CONCURRENCIES
    ]
    for run in runs:
        assert run["requests"] > 0 and run["errors"] == 0, run
        assert run["detectors"]["gauge-trend"]["verdict"] == "pass", run


def test_a_vllm_that_skips_frees_fails_the_gate_on_its_usage_gauge(tmp_path, model):
    log = tmp_path / "vllm.log"
    with VllmServer(PYTHON, model, log, fault="free-skipped", probe=True) as server:
        code, summary, err = black_box_gate(server, tmp_path / "out")
        after = audit(server)
    assert code == 1, err[-3000:]
    # white-box: each request whose free was skipped, by id, with its blocks
    assert after["findings"] and {f["rule"] for f in after["findings"]} == {"orphan-holder"}
    assert all(len(f["requests"]) == 1 and f["blocks"] for f in after["findings"])
    assert after["holding_requests"] == len(after["findings"])
    assert PLANTED in log.read_text()  # in the engine core, by the plugin
    assert summary["detectors"] == {"gauge-trend": "fail", "requests": "pass"}
    for run in summary["runs"]:
        verdict = run["detectors"]["gauge-trend"]
        assert verdict["verdict"] == "fail", run
        assert "vllm:kv_cache_usage_perc" in verdict["evidence"]


# A pool small enough that cached blocks are handed out again within a run at
# c = 8 (3072 tokens; the CPU backend wants blocks of 32).
SMALL_POOL = (
    "--vllm-arg=--block-size=32",
    "--vllm-arg=--num-gpu-blocks-override=96",
    "--vllm-arg=--max-model-len=2048",
)


def white_box_gate(model: Path, out: Path, *flags: str) -> tuple[int, dict, str]:
    cmd = [
        *(sys.executable, "-m", "kvwatch", "gate", "--out", str(out), "--no-report"),
        *("--engine", "vllm", "--model", str(model), "--vllm-python", PYTHON),
        *("-c", "1,2,4,8", *SMALL_POOL, *flags),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=2400)
    summary = json.loads((out / "summary.json").read_text())
    return proc.returncode, summary, proc.stderr


def test_the_white_box_gate_passes_a_clean_vllm(tmp_path, model):
    code, summary, err = white_box_gate(model, tmp_path / "out")
    assert code == 0, err[-3000:]
    assert [(r["profile"], r["concurrency"]) for r in summary["runs"]] == [
        (p, c) for p in PROFILES for c in CONCURRENCIES
    ]
    for run in summary["runs"]:
        assert run["requests"] > 0 and run["errors"] == 0, run
        assert {d: v["verdict"] for d, v in run["detectors"].items()} == dict.fromkeys(
            VLLM_DETECTORS, "pass"
        ), run
    log = (tmp_path / "out" / "servers" / "vllm.log").read_text()
    assert "kvwatch: probe on http://127.0.0.1:" in log and "planted" not in log


def test_the_white_box_gate_names_a_hash_left_on_a_reused_block_that_usage_cannot_show(
    tmp_path, model
):
    code, summary, err = white_box_gate(model, tmp_path / "out", "--inject", "evicted-hash-kept")
    assert code == 1, err[-3000:]
    assert summary["detectors"]["tree"] == "fail"
    runs = summary["runs"]
    # the usage gauge, all a black-box gate has, passes every run: usage is untouched
    assert all(r["detectors"]["gauge-trend"]["verdict"] == "pass" for r in runs)
    assert all(r["detectors"]["allocator"]["verdict"] == "pass" for r in runs)
    caught = [r for r in runs if r["detectors"]["tree"]["verdict"] == "fail"]
    assert any(r["concurrency"] == 8 for r in caught)
    evidence = caught[0]["detectors"]["tree"]["evidence"]
    # the hash and the block it points at (requests are named when they hold it)
    assert re.search(r"stale-hash-entry: hash [0-9a-f]+@g0 maps to block \d+", evidence)


def test_each_white_box_run_answers_only_for_the_leaks_it_made(tmp_path, model):
    """One vLLM serves every run of a gate: the orphans run c=1 left are in run
    c=2's baseline probe, and run c=2 fails on its own leaks, never on those."""
    out = tmp_path / "out"
    cmd = [
        *(sys.executable, "-m", "kvwatch", "gate", "--out", str(out), "--no-report"),
        *("--engine", "vllm", "--model", str(model), "--vllm-python", PYTHON),
        *("--profile", "agentic-trie", "-c", "1,2", "--inject", "free-skipped"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 1, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert [r["detectors"]["allocator"]["verdict"] for r in summary["runs"]] == ["fail", "fail"]
    record = json.loads((out / "runs" / "agentic-trie-c2" / "record.json").read_text())
    orphan = "orphan-holder: request "
    left = [
        f["key"][len(orphan) :]
        for f in record["baseline"]["findings"]
        if f.get("key", "").startswith(orphan)
    ]
    assert left and record["baseline"]["step"] > 0  # c=1's orphans, on a vLLM that has served
    blamed = summary["runs"][1]["detectors"]["allocator"]["details"]
    assert blamed and not any(rid in d["detail"] for d in blamed for rid in left)
