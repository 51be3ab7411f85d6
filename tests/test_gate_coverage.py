"""The default gate at c = 8 takes every lifecycle transition, and passes clean.

This is ``make run``'s load at its highest concurrency: every profile, one
``kvwatch gate`` process. It checks that the run's coverage (in
``summary.json`` and on the console) lists no transition as never taken, that
nothing happened outside the machines, and that a clean engine passes every
detector with every oracle on (quiescence, full equivalence, heap).
"""

from __future__ import annotations

import pytest
from test_gate_runs import failing, gate

from kvwatch.gate.profiles import PROFILES
from kvwatch.telemetry.coverage import MACHINES

pytestmark = pytest.mark.e2e


def test_the_default_gate_at_c8_takes_every_transition(tmp_path):
    code, summary, err = gate(tmp_path, "-c", "8")
    assert code == 0, err[-3000:]
    assert summary["verdict"] == "pass" and failing(summary) == set()
    assert [r["profile"] for r in summary["runs"]] == list(PROFILES)
    total = summary["coverage"]["total"]
    for name, machine in MACHINES.items():
        assert total[name]["never"] == [], (name, total[name])
        assert set(total[name]["taken"]) == set(machine.transitions)
        assert total[name]["unlisted"] == {}, (name, total[name]["unlisted"])
    assert "every transition taken" in err
    # every comparable request was compared, in every run
    for run in summary["runs"]:
        note = run["detectors"]["equivalence"]["evidence"]
        compared, finished = note.split(" equal")[0].split(" of ")
        assert int(compared) == int(finished.split()[0]) > 0, note
