"""The white-box checks (``targets/vllm/checks.py``) on vLLM's own scheduler.

vLLM lives in its own venv, so ``planted/checks.py`` (beside this file) runs there
(``KVWATCH_VLLM_PYTHON``; without it these skip): it drives vLLM's scheduler
as ``--engine vllm-scheduler`` does, plants each broken state and prints what
the checks found as JSON. Each plant must give its own rules, naming the
requests and blocks involved; the clean loads give none.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

PYTHON = os.environ.get("KVWATCH_VLLM_PYTHON")
PLANTED = Path(__file__).parent / "planted"  # run by vLLM's Python, never collected
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not PYTHON, reason="needs vLLM's venv: run `make test-vllm`"),
]


@pytest.fixture(scope="module")
def runs() -> dict:
    cmd = [PYTHON, "-P", str(PLANTED / "checks.py")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_clean_sessions_waves_and_priority_preemption_give_no_finding(runs):
    assert runs["clean"] == {"streaming-input": [], "waves": [], "priority": []}


def test_hashes_kept_for_replaced_tokens_are_found_on_the_request_its_block_and_a_hit(runs):
    run = runs["stale"]
    assert run["rules"] == [
        "request-hash-stale",
        "block-hash-vs-tokens",
        "shared-block-tokens",
        "hit-on-other-tokens",
    ]
    first = run["first"]
    assert first["request-hash-stale"]["requests"] == ["A"]
    assert "block_hashes[0]" in first["request-hash-stale"]["detail"]
    block = first["block-hash-vs-tokens"]["blocks"]
    assert first["hit-on-other-tokens"]["blocks"] == block
    assert first["hit-on-other-tokens"]["requests"] == ["A", "B"]  # B read A's new KV


def test_scratch_left_at_idle_over_the_pool_and_a_dead_key_are_named(runs):
    run = runs["scratch"]
    assert run["rules"] == ["scratch-not-drained", "scratch-over-pool", "dead-request-key"]
    first = run["first"]
    assert first["scratch-not-drained"]["blocks"] == [3, 4]
    assert "new_block_ids" in first["scratch-not-drained"]["detail"]
    assert f"more than the pool's {run['pool']} blocks" in first["scratch-over-pool"]["detail"]
    assert first["dead-request-key"]["requests"] == ["wave-0-0"]


def test_a_running_request_the_walk_never_reached_is_skipped(runs):
    run = runs["skipped"]
    assert run["rules"] == ["running-skipped"]
    assert run["first"]["running-skipped"]["requests"] == run["hidden"]
