"""The pytest plugin: an engine team's own test fails with the detector's evidence,
through the ``leak_gate`` fixture's block or the ``@pytest.mark.leak_gate`` marker
(its report section, terminal summary, ``max_pages`` bound, usage errors and the
drain-only judgement of a test without barriers).

The inner pytest runs in a subprocess: run in process, pytester restores
``sys.modules`` afterwards, dropping numpy.fft if the inner run imported it
first, and numpy's extension then refuses a second import in this worker
(every later scipy.stats user on it failed).
"""

from __future__ import annotations

import pytest

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


# -- @pytest.mark.leak_gate ------------------------------------------------------------------

MARKED_FILE = """
import pytest
from kvwatch.engine import Engine, EngineConfig, SamplingParams

LEAK = frozenset({"root-ref-leak-on-miss"})


@pytest.fixture
def engine():
    return Engine(EngineConfig())


@pytest.fixture
def leaky():
    return Engine(EngineConfig(faults=LEAK))


def run_turns(engine, leak_gate_turn):
    for turn in range(4):
        engine.generate([[40 + turn] * 20], SamplingParams(max_tokens=2))
        leak_gate_turn()


@pytest.mark.leak_gate(warmup=1)
def test_clean(engine, leak_gate_turn):
    run_turns(engine, leak_gate_turn)


@pytest.mark.leak_gate(probe="leaky", warmup=1)
def test_leaky(leaky, leak_gate_turn):
    run_turns(leaky, leak_gate_turn)


@pytest.mark.leak_gate(probe="leaky", warmup=1)
def test_body_fails_first(leaky, leak_gate_turn):
    run_turns(leaky, leak_gate_turn)
    assert 1 == 2


def test_not_gated():
    pass
"""


def test_the_marker_puts_each_verdict_in_the_report_section_and_fails_the_leaky_test(pytester):
    """The leaky test fails with refcount's evidence as its message and in its
    section; the clean one passes with every verdict in its section (``-rP``
    prints a passed test's sections, ``-rf`` the failures' short lines); a body that failed keeps its own failure."""
    pytester.makepyfile(test_marked=MARKED_FILE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rfP")
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*_ test_leaky _*",
            "kvwatch detector 'refcount' failed at turn 0:",
            "  root refs 1, live holders imply 0",
            "*- kvwatch leak gate -*",
            "4 barriers recorded (warm-up: the first 1); after the test: drained, cache flushed",
            "allocator   pass *",
            "refcount    FAIL     at turn 0",
            "*root refs 1, live holders imply 0",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*_ test_body_fails_first _*",
            "E       assert 1 == 2",
            "*- kvwatch leak gate -*",
            "refcount    FAIL     at turn 0",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*_ test_clean _*",
            "*- kvwatch leak gate -*",
            "refcount    pass     root and node refs exact in 5 probes",
            "slot-table  pass     *",
        ]
    )
    result.stdout.fnmatch_lines(["FAILED test_marked.py::test_body_fails_first - assert 1 == 2"])


def summary_of(result) -> list[str]:
    """The lines of the ``kvwatch leak gate`` terminal summary, up to the next rule."""
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if "= kvwatch leak gate =" in line)
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("==="))
    return lines[start + 1 : end]


CLEAN_LINE = (
    "PASS test_marked.py::test_clean (4 turns): "
    "allocator pass, refcount pass, tree pass, slot-table pass"
)
LEAKY_LINES = [
    "FAIL test_marked.py::test_leaky (4 turns): "
    "allocator pass, refcount FAIL, tree pass, slot-table pass",
    "    refcount: turn 0: root refs 1, live holders imply 0 (+1 more)",
]


def test_the_terminal_summary_lists_every_gated_test_with_its_verdicts(pytester):
    pytester.makepyfile(test_marked=MARKED_FILE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    summary = summary_of(result)
    assert summary[:3] == [CLEAN_LINE, *LEAKY_LINES]
    assert summary[3].startswith("FAIL test_marked.py::test_body_fails_first (4 turns)")
    assert not [line for line in summary if "test_not_gated" in line]


def test_the_summary_and_the_sections_come_back_from_xdist_workers(pytester):
    """Under pytest-xdist the controller prints the summary: what it needs travels
    on the call reports, as the section does."""
    pytest.importorskip("xdist")
    pytester.makepyfile(test_marked=MARKED_FILE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2")
    result.assert_outcomes(passed=2, failed=2)
    summary = summary_of(result)
    assert CLEAN_LINE in summary
    assert LEAKY_LINES[0] in summary
    assert summary[summary.index(LEAKY_LINES[0]) + 1] == LEAKY_LINES[1]
    result.stdout.fnmatch_lines(["*_ test_leaky _*", "*- kvwatch leak gate -*", "refcount*FAIL*"])


BOUND_FILE = """
import pytest
from kvwatch.engine import Engine, SamplingParams


@pytest.fixture
def engine():
    return Engine()


def long_prompt(engine, leak_gate_turn):
    engine.generate([[7] * 200], SamplingParams(max_tokens=2))  # 12 full.kv pages of cache
    leak_gate_turn()


@pytest.mark.leak_gate(max_pages={"full.kv": 8})
def test_over_the_bound(engine, leak_gate_turn):
    long_prompt(engine, leak_gate_turn)


@pytest.mark.leak_gate(max_pages={"full.kv": 64, "swa.kv": 8})
def test_under_the_bound(engine, leak_gate_turn):
    long_prompt(engine, leak_gate_turn)
"""


def test_max_pages_fails_a_test_holding_more_pages_and_passes_one_under_it(pytester):
    pytester.makepyfile(test_bound=BOUND_FILE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rP")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_over_the_bound _*",
            "kvwatch bound 'max_pages' failed at turn 0:",
            "  [full.kv] 12 pages held (12 of them evictable), max_pages allows 8; peak 12",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*_ test_under_the_bound _*",
            "*- kvwatch leak gate -*",
            "max_pages * pass * full.kv held at most 12 of 64, swa.kv held at most 0 of 8 pages*",
        ]
    )
    assert "PASS test_bound.py::test_under_the_bound" in "\n".join(summary_of(result))


USAGE_FILE = """
import pytest
from kvwatch.engine import Engine

RAN = []


@pytest.fixture
def engine():
    return Engine()


@pytest.mark.leak_gate(detectors=("allocator", "no-such-detector"))
def test_unknown_detector(engine):
    RAN.append("body")


@pytest.mark.leak_gate(max_page={"full.kv": 8})
def test_unknown_argument(engine):
    RAN.append("body")


@pytest.mark.leak_gate(probe="server")
def test_probe_fixture_not_used(engine):
    RAN.append("body")


def test_no_body_ran():
    assert RAN == []
"""


def test_a_marker_the_plugin_cannot_honour_is_the_tests_error_with_a_clear_message(pytester):
    """An unknown detector id, an unknown argument, a probe fixture the test does not
    use: each test errors at setup with the message alone, and its body never runs."""
    pytester.makepyfile(test_usage=USAGE_FILE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=3)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at setup of test_unknown_detector*",
            "@pytest.mark.leak_gate(detectors=...): unknown detector 'no-such-detector'; "
            "detectors are allocator, refcount, tree, heap, *",
            "*ERROR at setup of test_unknown_argument*",
            "@pytest.mark.leak_gate: unknown argument max_page; it takes *max_pages*",
            "*ERROR at setup of test_probe_fixture_not_used*",
            "@pytest.mark.leak_gate(probe='server'): the test does not use a fixture 'server'*",
        ]
    )
    assert "During handling" not in result.stdout.str()  # the message alone, no chain


UNMARKED_FILE = """
def test_barriers_without_the_marker(leak_gate_turn):
    leak_gate_turn()
"""


def test_the_barrier_fixture_errors_clearly_on_a_test_without_the_marker(pytester):
    pytester.makepyfile(test_unmarked=UNMARKED_FILE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at setup of test_barriers_without_the_marker*",
            "the leak_gate_turn fixture records barriers of a test marked "
            "@pytest.mark.leak_gate, and test_unmarked.py::test_barriers_without_the_marker "
            "is not; *",
        ]
    )


DRAIN_FILE = """
import pytest
from kvwatch.engine import Engine, SamplingParams


@pytest.fixture
def engine():
    return Engine()


def one_session_turn(engine):
    session = engine.open_session()
    rid = engine.add_request([40] * 200, SamplingParams(max_tokens=2), session_id=session)
    while engine.has_unfinished():
        engine.step()
    engine.take(rid)
    return session


@pytest.mark.leak_gate
def test_leaves_its_session_open(engine):
    one_session_turn(engine)


@pytest.mark.leak_gate
def test_closes_its_session(engine):
    engine.close_session(one_session_turn(engine))
"""


def test_without_barriers_the_probe_after_the_test_is_judged_on_the_drain_rule(pytester):
    """No barrier: the session left open holds pages after the test (the flush
    cannot take them) and fails allocator's drain rule; the closed one passes,
    its detectors skipped for want of a turn, never passed."""
    pytester.makepyfile(test_drain=DRAIN_FILE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_leaves_its_session_open _*",
            "kvwatch detector 'allocator' failed after the drain:",
            "  [full.kv] 13 pages still used, 0 before the run; by owner {'session': 13}",
            "*1 live sessions left, 0 before",
            "*- kvwatch leak gate -*",
            "no barrier recorded: only the probe after the test was judged*",
        ]
    )
    summary = summary_of(result)
    assert summary[0].startswith(
        "FAIL test_drain.py::test_leaves_its_session_open (no barrier: drain only): allocator FAIL"
    )
    assert summary[2] == (
        "PASS test_drain.py::test_closes_its_session (no barrier: drain only): "
        "allocator skipped, refcount skipped, tree skipped, slot-table skipped"
    )
