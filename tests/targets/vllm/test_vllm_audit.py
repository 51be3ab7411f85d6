"""The white-box audit (``targets/vllm/manager_audit.py``) on a real vLLM KV cache manager.

vLLM lives in its own venv, so ``planted/manager_audit.py`` (beside this file) runs there
(``KVWATCH_VLLM_PYTHON``; without it these skip): it drives a 64-block
``KVCacheManager`` through the scheduler's calls, plants each bug and prints
the audits as JSON. Each planted bug must give exactly its own finding, naming
the blocks, requests and hash vLLM itself reports; the clean run gives none.
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
    # -P: no working directory on sys.path, so no stray module shadows vLLM's imports
    cmd = [PYTHON, "-P", str(PLANTED / "manager_audit.py")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def rules(audit: dict) -> list[str]:
    return [f["rule"] for f in audit["findings"]]


def test_a_clean_run_with_a_shared_prefix_and_a_freed_request_has_no_findings(runs):
    run = runs["clean"]
    assert run["hit"] == 32 and run["shared"] == run["a_blocks"][:2] == run["b_blocks"][:2]
    assert run["refs_both_live"] == [2, 2] and run["refs_after"] == [1, 1]
    assert run["both_live"]["findings"] == [] and run["findings"] == []
    # A's third block stays cached while free: ref 0, in the free queue, still hashed
    assert run["cached_free"] == [run["a_blocks"][2]]
    assert run["blocks_free"] + run["blocks_referenced"] + 1 == run["blocks_total"] == 64
    assert run["blocks_referenced"] == len(run["b_blocks"]) and run["holding_requests"] == 1


def test_a_skipped_free_names_the_request_and_its_blocks_where_usage_cannot(runs):
    run = runs["leaked"]
    assert rules(run) == ["orphan-holder"]
    (finding,) = run["findings"]
    assert finding["requests"] == ["A"] and finding["blocks"] == sorted(run["a_blocks"])
    assert "2 held by no live request" in finding["detail"]
    assert run["usage"] == run["usage_a_live"]  # the gauge reads the same as a live A
    assert run["as_if_live"]["findings"] == []


def test_a_reference_nobody_holds_on_a_shared_block_is_found_at_normal_usage(runs):
    run = runs["refcount"]
    assert rules(run) == ["refcount"]
    (finding,) = run["findings"]
    assert finding["blocks"] == [run["block"]] and finding["requests"] == ["B"]
    assert "ref_cnt 2 but 1 holders (B)" in finding["detail"]
    assert finding["hash"] is not None
    assert run["usage"] == run["usage_before"]


def test_a_hash_entry_left_on_a_reused_block_names_the_block_and_the_hash(runs):
    run = runs["stale"]
    assert rules(run) == ["stale-hash-entry"]
    (finding,) = run["findings"]
    assert finding["blocks"] == [run["block"]] and finding["hash"] == run["hash"]
    assert finding["requests"] == ["D"] and run["d_holds_block"]
    assert run["block"] in run["hit_for_a_prompt"]  # A's prompt would hit D's block


def test_blocks_waiting_in_deferred_frees_hold_their_references(runs):
    run = runs["deferred"]
    assert run["findings"] == [] and run["drained"]["findings"] == []
    without = run["without_deferred"]
    assert set(rules(without)) == {"refcount"}
    assert [f["blocks"] for f in without["findings"]] == [[b] for b in sorted(run["a_blocks"])]
    shared = set(run["a_blocks"]) & set(run["b_blocks"])
    for finding in without["findings"]:
        assert finding["requests"] == (["B"] if finding["blocks"][0] in shared else [])


def test_null_blocks_of_a_sliding_window_are_neither_holders_nor_counted(runs):
    run = runs["sliding"]
    assert run["nulls_in_s"] == 3 and run["hit"] == 64 and run["t_blocks"][:2] == [0, 0]
    assert run["both_live"]["findings"] == [] and run["findings"] == []
    assert run["null_ref_cnt"] == -3  # vLLM does not keep the null block's count
    assert run["blocks_referenced"] == 3 and run["blocks_free"] == 60
