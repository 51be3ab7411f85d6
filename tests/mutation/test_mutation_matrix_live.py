"""The faults of the agentic-trie and abort-storm profiles through ``kvwatch gate``
itself: a real server with the fault built in, Locust users, the HTTP probes. The
other profiles' faults are in ``test_mutation_matrix_live_sessions.py``; ``make
matrix`` runs every fault at every c, and the clean cells."""

from __future__ import annotations

import pytest
from matrixlive import assert_caught, cells_on

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


@pytest.mark.parametrize("job", cells_on("agentic-trie", "abort-storm"), ids=lambda j: j.name)
def test_the_gate_fails_on_the_fault_with_its_detector(tmp_path, job):
    assert_caught(job, tmp_path)
