"""The pytest plugin: an engine team's own test fails with the detector's evidence.

The inner pytest runs in a subprocess: run in process, pytester restores
``sys.modules`` afterwards, dropping numpy.fft if the inner run imported it
first, and numpy's extension then refuses a second import in this worker
(every later scipy.stats user on it failed).
"""

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
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*kvwatch detector 'refcount' failed at turn 0*", "*root refs 1, live holders imply 0*"]
    )


HEAP_TEST_FILE = """
from kvwatch.engine import Engine

KEPT = []

def run_turns(leak, leak_gate):
    engine = Engine()
    with leak_gate(engine.probe, heap=True, detectors=()) as gate:
        for turn in range(8):
            context = 2000 * (turn + 1)
            KEPT.append(bytearray(context * (turn + 1) if leak else 0))  # O(turns x prefix)
            if not leak:
                KEPT[:] = [bytearray(50 * context)]  # O(prefix): replaced, not kept
            gate.turn(conversations=1, context_tokens=context)

def test_o_prefix(leak_gate):
    run_turns(False, leak_gate)

def test_o_turns_times_prefix(leak_gate):
    KEPT.clear()
    run_turns(True, leak_gate)
"""


def test_heap_true_samples_this_process_and_fails_on_growth_per_context_token(pytester):
    pytester.makepyfile(test_heap_turns=HEAP_TEST_FILE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*kvwatch detector 'heap' failed at turn*", "*retained bytes per held token rise*"]
    )
