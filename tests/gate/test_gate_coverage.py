"""The default gate at c = 8, and the quick tier at c = 2, take every lifecycle
transition and every combination and boundary edge, and pass clean.

This is ``make run``'s load at its highest concurrency: every profile, one
``kvwatch gate`` process. It checks that the run's coverage (in
``summary.json`` and on the console) lists no transition as never taken, that
nothing happened outside the machines, and that a clean engine passes every
detector with every oracle on (quiescence, full equivalence, heap). The
edges profile alone at c = 8 takes every combination and boundary edge.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_gate_runs import failing

from kvwatch.harness.profiles import PROFILES
from kvwatch.instrumentation import combos
from kvwatch.instrumentation.coverage import MACHINES

pytestmark = pytest.mark.e2e


def gate(out, *args: str, timeout: float = 2400) -> tuple[int, dict, str, str]:
    """``kvwatch gate``: its exit code, summary, stdout (results) and stderr (progress)."""
    cmd = [sys.executable, "-m", "kvwatch", "gate", "--out", str(out), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    path = out / "summary.json"
    summary = json.loads(path.read_text()) if path.exists() else {}
    return proc.returncode, summary, proc.stdout, proc.stderr


def assert_all_taken(total: dict, names) -> None:
    for name in names:
        assert total[name]["never"] == [], (name, total[name])
        machine = MACHINES[name]
        assert set(machine.transitions) <= set(total[name]["taken"])
        assert set(total[name]["taken"]) <= {*machine.transitions, *machine.also}
        assert total[name]["unlisted"] == {}, (name, total[name]["unlisted"])


def test_the_default_gate_at_c8_takes_every_transition(tmp_path):
    code, summary, out, err = gate(tmp_path, "-c", "8")
    assert code == 0, err[-3000:]
    assert summary["verdict"] == "pass" and failing(summary) == set()
    assert [r["profile"] for r in summary["runs"]] == list(PROFILES)
    assert_all_taken(summary["coverage"]["total"], MACHINES)
    line = next(x for x in out.splitlines() if x.startswith("coverage: "))
    assert line.endswith("every transition taken") and len(line) < 200, line
    # every comparable request was compared, in every run
    for run in summary["runs"]:
        note = run["detectors"]["equivalence"]["evidence"]
        compared, finished = note.split(" equal")[0].split(" of ")
        assert int(compared) == int(finished.split()[0]) > 0, note


def test_the_quick_tier_takes_every_transition_the_default_gate_owes(tmp_path):
    """The pull-request tier (every profile at c = 2) reaches what the default gate
    reaches at c = 1 and 8 too: the host tier's cache taken back by pressure and by
    the flush, and every other listed transition; it passes clean."""
    code, summary, out, err = gate(tmp_path, "--quick")
    assert code == 0, err[-3000:]
    assert summary["verdict"] == "pass" and failing(summary) == set()
    total = summary["coverage"]["total"]
    assert_all_taken(total, MACHINES)
    host = total["host snapshot"]["taken"]
    assert host["host -> pruned"] > 0 and host["host -> flushed"] > 0, host
    line = next(x for x in out.splitlines() if x.startswith("coverage: "))
    assert line.endswith("every transition taken"), line


def test_the_edges_profile_at_c8_takes_every_combination_and_boundary_edge(tmp_path):
    code, summary, _out, err = gate(tmp_path, "--profile", "edges", "-c", "8")
    assert code == 0, err[-3000:]
    assert summary["verdict"] == "pass" and failing(summary) == set()
    total = summary["coverage"]["total"]
    # the failpoints of the slot backend and of sessions fire in the profiles that
    # run them: that machine is the whole default gate's to complete (above)
    assert_all_taken(total, [m[0] for m in combos.MACHINES if m[0] != combos.FAILPOINT])
    for name in ("request", "session", "slot"):
        assert total[name]["unlisted"] == {}, (name, total[name]["unlisted"])
    (run,) = summary["runs"]
    note = run["detectors"]["equivalence"]["evidence"]
    compared, finished = note.split(" equal")[0].split(" of ")
    assert int(compared) == int(finished.split()[0]) > 300, note  # the siblings were compared
