"""The faults of the session and slot profiles (streaming-session, rl-rollout,
slot-cache) through ``kvwatch gate`` itself; see ``test_mutation_matrix_live.py``."""

from __future__ import annotations

import pytest
from matrixlive import ROTATION, assert_caught, cells_on

from kvwatch.gate.verdicts.catches import CATCHES

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
PROFILES = ("streaming-session", "rl-rollout", "slot-cache")


@pytest.mark.parametrize("job", cells_on(*PROFILES), ids=lambda j: j.name)
def test_the_gate_fails_on_the_fault_with_its_detector(tmp_path, job):
    assert_caught(job, tmp_path)


def test_the_two_files_run_every_fault_and_every_concurrency():
    both = cells_on("agentic-trie", "abort-storm") + cells_on(*PROFILES)
    assert sorted(both) == sorted(ROTATION)
    assert {j.fault for j in both} == set(CATCHES)
    assert {j.concurrency for j in both} == {1, 2, 4, 8}
