"""The gate's fault table (``gate/verdicts/catches.py``): every fault the engine can
plant has a profile that reaches it and a detector that must catch it, and the
CLI's listings (``kvwatch faults``, ``kvwatch profiles``) say the same."""

from __future__ import annotations

import json
import subprocess
import sys

from kvwatch.gate.verdicts.catches import (
    CATCHES,
    HISTORY_CATCHES,
    HISTORY_TIER,
    catch_of,
    exposed_by,
)
from kvwatch.gate.verdicts.detectors import IDS
from kvwatch.harness.profiles import PROFILES
from kvwatch.histories.checks import CHECKS


def kvwatch(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "kvwatch", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_every_fault_has_a_profile_and_a_detector_that_catch_it():
    """A gate profile and detector, or the history tier and one of its checks."""
    out = json.loads(kvwatch("faults", "--json").stdout)
    assert {e["name"] for e in out} == set(CATCHES) | set(HISTORY_CATCHES)
    for entry in out:
        assert (entry["profile"], entry["detector"]) == catch_of(entry["name"]), entry["name"]
    for fault, catch in CATCHES.items():
        assert catch.profile in PROFILES and catch.detector in IDS, fault
    for fault, catch in HISTORY_CATCHES.items():
        assert catch.profile == HISTORY_TIER and catch.detector in CHECKS, fault


def test_each_profile_lists_the_faults_it_is_there_to_expose():
    entries = json.loads(kvwatch("profiles", "--json").stdout)
    listed = {fault: entry["name"] for entry in entries for fault in entry["faults"]}
    assert listed == {fault: catch.profile for fault, catch in CATCHES.items()}
    assert HISTORY_TIER not in PROFILES  # the history tier is no gate profile
    assert exposed_by("agentic-trie")[0] == "interior-snapshot-leak"  # CATCHES order
    assert exposed_by("bad-input") == ()
