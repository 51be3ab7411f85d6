"""The pytest plugin: an engine team's own test fails with the detector's evidence."""

from __future__ import annotations

pytest_plugins = ["pytester"]

TEST_FILE = """
from kvwatch.engine import Engine, EngineConfig, SamplingParams

def run_turns(faults, leak_gate):
    engine = Engine(EngineConfig(faults=faults))
    with leak_gate(engine.probe, warmup=1) as gate:
        for turn in range(4):
            engine.generate([[40 + turn] * 20], SamplingParams(max_tokens=2))
            gate.turn()

def test_clean(leak_gate):
    run_turns(frozenset(), leak_gate)

def test_leaky(leak_gate):
    run_turns(frozenset({"root-ref-leak-on-miss"}), leak_gate)
"""


def test_leak_gate_fails_the_leaky_test_with_evidence_and_passes_the_clean_one(pytester):
    pytester.makepyfile(test_engine_turns=TEST_FILE)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*kvwatch detector 'refcount' failed at turn 0*", "*root refs 1, live holders imply 0*"]
    )
