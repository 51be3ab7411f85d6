"""One case of ``make vllm-hunt`` through vLLM's own scheduler in its driver process.

vLLM lives in its own venv (``KVWATCH_VLLM_PYTHON``; without it this skips): a
``mixed`` case in a hybrid layout with a finer hash unit runs clean, its row
carrying the resolved sizes and what the run covered.
"""

from __future__ import annotations

import os
from argparse import Namespace

import pytest

from hunts import driver_runs
from hunts import vllm as hunt
from kvwatch.targets.vllm.kv_layout import parse
from kvwatch.targets.vllm.release import ask, find

PYTHON = os.environ.get("KVWATCH_VLLM_PYTHON")
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not PYTHON, reason="needs vLLM's venv: run `make test-vllm`"),
]


def test_one_hunt_case_reports_its_coverage_and_sizes(tmp_path):
    case = driver_runs.Case(
        release="here",
        profile="mixed",
        layout=parse("full+mamba/b64/u16/events"),
        sched="fcfs",
        seed=1,
        options=hunt.SCHEDS["fcfs"],
    )
    release = find(ask(PYTHON)["vllm"], PYTHON)
    args = Namespace(steps=12, turns=2, c=2, timeout=300)
    (row,) = driver_runs.run_batch([case], release, args)
    assert row["error"] is None and row["rules"] == {}, row
    assert row["sizes"]["hash"] == 16 and row["sizes"]["block"] == 64
    assert row["coverage"]["requests"] > 0 and row["coverage"]["events"]["keys stored"] > 0
