"""The KV cache layouts users turn on, on vLLM's own scheduler: clean, planted, gated.

vLLM lives in its own venv (``KVWATCH_VLLM_PYTHON``; without it these skip):
``planted/layouts.py`` (beside this file) runs there and prints what the checks saw
with each layout profile clean and with each fault planted in vLLM's own
``BlockPool`` (events dropped, doubled, invented; partial-block entries moved
or foreign); the gate runs the layout profiles on the venv's vLLM and on the
newest release (0.33.0, its GPU wheel's Python unpacked over the venv:
``make vllm-release V=0.33.0``); one hunt case: ``tests/hunts/test_vllm_hunt_live.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvwatch.targets.vllm.release import find

PYTHON = os.environ.get("KVWATCH_VLLM_PYTHON")
PLANTED = Path(__file__).parent / "planted"  # run by vLLM's Python, never collected
NEWEST = "0.33.0"
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not PYTHON, reason="needs vLLM's venv: run `make test-vllm`"),
]


@pytest.fixture(scope="module")
def runs() -> dict:
    cmd = [PYTHON, "-P", str(PLANTED / "layouts.py")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_each_layout_profile_runs_clean_and_exercises_what_its_layout_adds(runs):
    clean = runs["clean"]
    assert {name: r["rules"] for name, r in clean.items()} == {
        "mid-block-prefix": [],
        "hybrid-swa": [],
        "hybrid-mamba": [],
        "kv-events": [],
    }
    fine = clean["mid-block-prefix"]["coverage"]
    assert fine["mid-block hits"] > 0 and fine["partial entries (most)"] > 0
    assert fine["block copies"] > 0  # a hit inside a block is served through a copy
    assert clean["hybrid-mamba"]["coverage"]["preemptions"] > 0
    assert clean["hybrid-swa"]["coverage"]["aborts"] > 0
    for name, run in clean.items():
        events = run["coverage"]["events"]
        assert events["keys stored"] > 0 and events["keys removed"] > 0, name
        assert events["AllBlocksCleared"] >= 1 and events["keys held"] == 0, name


@pytest.mark.parametrize(
    ("scenario", "rule"),
    [
        ("removal-dropped", "event-stored-not-held"),
        ("removal-doubled", "event-removed-unstored"),
        ("store-dropped", "event-unannounced"),
        ("store-invented", "event-stored-not-held"),
    ],
)
def test_each_event_fault_planted_in_vllms_block_pool_is_caught(runs, scenario, rule):
    assert runs[scenario]["rules"] == [rule]
    assert "hash" in runs[scenario]["first"][rule]["detail"]


def test_partial_block_entries_moved_or_foreign_are_caught_on_live_requests(runs):
    moved, foreign = runs["partial-moved"], runs["extra-key-foreign"]
    assert moved["planted"] >= 2 and foreign["planted"] >= 1
    assert moved["rules"] == ["block-hash-vs-tokens", "partial-hash-span"]
    assert moved["first"]["block-hash-vs-tokens"]["blocks"] == [moved["block"]]
    assert foreign["rules"] == ["block-hash-vs-tokens"]
    assert "(a partial entry)" in foreign["first"]["block-hash-vs-tokens"]["detail"]


def test_sessions_that_hold_the_pool_while_waiting_for_input_stall_and_are_named(runs):
    """vLLM's own hold-and-wait (open upstream as PR #49439), nothing planted."""
    stall = runs["sessions-stall"]
    assert stall["rules"] == ["scheduler-stalled"] and stall["aborted"] == 2
    found = stall["first"]["scheduler-stalled"]
    assert found["requests"] == ["A", "B"] and "0 of 10 blocks free" in found["detail"]


def test_a_forced_reset_while_a_session_waits_for_input_is_refused_and_named(runs):
    """vLLM's own (``docs/real-bugs/vllm_reset_with_waiting_session.py``), nothing planted."""
    reset = runs["sessions-reset"]
    assert reset["reset"] is False and reset["rules"] == ["reset-refused"]
    assert reset["status"] == {"R": "PREEMPTED", "S": "WAITING_FOR_STREAMING_REQ"}
    found = reset["first"]["reset-refused"]
    assert found["requests"] == ["S"] and "WAITING_FOR_STREAMING_REQ" in found["detail"]


def gate(tmp_path, *flags: str) -> tuple[int, dict, str]:
    out = tmp_path / "gate"
    cmd = [sys.executable, "-m", "kvwatch", "gate", "--engine", "vllm-scheduler", "-c", "2"]
    cmd += [*flags, "--out", str(out), "--no-report", "--vllm-python", PYTHON]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    return (
        proc.returncode,
        json.loads((out / "summary.json").read_text()),
        proc.stdout + proc.stderr,
    )


def test_the_gate_passes_every_layout_profile_on_vllms_scheduler(tmp_path):
    profiles = ("mid-block-prefix", "hybrid-swa", "hybrid-mamba", "kv-events")
    code, summary, log = gate(tmp_path, *(f"--profile={p}" for p in profiles))
    assert code == 0, log[-3000:]
    assert summary["verdict"] == "pass" and len(summary["runs"]) == 4


def test_the_newest_release_runs_fine_hashes_and_events_from_its_gpu_wheel(tmp_path):
    try:
        release = find(NEWEST, PYTHON)
    except ValueError as exc:
        pytest.skip(str(exc))
    assert not release.serves  # it pins a torch the venv does not have
    code, summary, log = gate(tmp_path, "--profile=mid-block-prefix", "--vllm-version", NEWEST)
    assert code == 0, log[-3000:]
    assert summary["verdict"] == "pass"
    assert f"vLLM {NEWEST}'s scheduler in process" in log
