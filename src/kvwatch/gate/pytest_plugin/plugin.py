"""A pytest plugin (entry point ``pytest11: kvwatch``): gate your own tests on leaks.

The marker judges a whole test: the baseline probe once its fixtures are set
up, a barrier each time it calls ``leak_gate_turn()``, and a final probe once
its body returns (drained, and flushed where the probe fixture's value has
``flush_cache()``, as an ``Engine`` has)::

    @pytest.mark.leak_gate(probe="engine", warmup=1, max_pages={"full.kv": 512})
    def test_agent_turns_do_not_leak(engine, leak_gate_turn):
        for turn in range(8):
            run_one_turn(engine)
            leak_gate_turn()                      # a barrier, the engine idle

Each detector's verdict goes into the test's report section ``kvwatch leak
gate``; a failing one (or a bound broken) fails a test whose body passed,
naming the detector and its evidence; a test whose body failed keeps its own
failure and gets the section. A test that records no barrier is judged on the
probe after it alone (the drain rule: nothing held over the baseline);
detectors with nothing to judge are skipped, never passed. The terminal
summary lists every gated test. Marker arguments: ``options.py``.

The ``leak_gate`` fixture is the explicit form, for a block of a test::

    def test_agent_turns_do_not_leak(leak_gate):
        engine = Engine(EngineConfig())
        with leak_gate(engine.probe) as gate:
            for turn in range(8):
                run_one_turn(engine)
                gate.turn()                       # probe at the barrier

``probe`` is any callable returning a ``ProbeReport`` or the probe JSON of
``GET /debug/probe`` (a dict). At the end of the block the detectors judge the turns;
a failing one fails the test with its evidence (``explicit.py``). With
``heap=True`` either form also samples tracemalloc and needs ``context_tokens``
at every turn.

This module loads in every pytest run of anyone who installs kvwatch: the
detectors, the recorder and the engine's contracts load only when a test is
gated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from kvwatch.gate.pytest_plugin.explicit import LeakGate, leak_gate
from kvwatch.gate.pytest_plugin.options import (
    MARKER,
    MARKER_HELP,
    TURN_FIXTURE,
    MarkerError,
    MarkerOptions,
    options_from_marker,
    probe_target,
)
from kvwatch.gate.pytest_plugin.text import (
    SECTION,
    SUMMARY_PROPERTY,
    failure_message,
    section_text,
    summary_entry,
    summary_lines,
)

if TYPE_CHECKING:
    from kvwatch.gate.pytest_plugin.gated import GateOutcome, MarkedGate

__all__ = ["LeakGate", "leak_gate"]  # the explicit form, for a block of a test
T = TypeVar("T")
OPTIONS = pytest.StashKey["MarkerOptions"]()
GATE = pytest.StashKey["MarkedGate"]()
OUTCOME = pytest.StashKey["GateOutcome"]()


# -- the marker ---------------------------------------------------------------------------
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)
    config.pluginmanager.register(GatedTests(), "kvwatch-leak-gate-summary")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A marked test's arguments are checked before its fixtures are set up (this
    plugin registers after pytest's runner, so it is called first; a skip marker,
    called first of all, still skips): a usage error is the test's error, and its
    body does not run."""
    mark = item.get_closest_marker(MARKER)
    if mark is None:
        return
    options = _or_usage_error(lambda: options_from_marker(mark.args, mark.kwargs))
    if options.probe not in getattr(item, "fixturenames", ()):
        pytest.fail(
            f"@pytest.mark.{MARKER}(probe={options.probe!r}): the test does not use a "
            f"fixture {options.probe!r}; add it to the test's arguments, or name the "
            "fixture whose value is the engine (or its probe) with probe=",
            pytrace=False,
        )
    item.stash[OPTIONS] = options


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Baseline before the body, the final probe and the verdicts after it (whatever
    the body did); the outcome waits in the item's stash for its report."""
    options = item.stash.get(OPTIONS, None)
    if options is None:
        return (yield)
    item.stash[GATE] = gate = begin_gate(item, options)
    try:
        return (yield)
    finally:
        del item.stash[GATE]
        item.stash[OUTCOME] = end_gate(gate)


def begin_gate(item: pytest.Item, options: MarkerOptions) -> MarkedGate:
    """The gate over the probe fixture's value, its baseline taken."""
    from kvwatch.gate.pytest_plugin.gated import MarkedGate

    value = item.funcargs[options.probe]
    return _or_usage_error(lambda: MarkedGate(options, probe_target(options.probe, value)))


def _or_usage_error(make: Callable[[], T]) -> T:
    """``make()``; a ``MarkerError`` fails the test with its message alone."""
    try:
        return make()
    except MarkerError as exc:
        error = str(exc)
    pytest.fail(error, pytrace=False)  # outside the handler: no chained traceback


def end_gate(gate: MarkedGate) -> GateOutcome:
    """The gate's outcome; a final probe or a judge that raised is an outcome too."""
    from kvwatch.gate.pytest_plugin.gated import broken

    try:
        return gate.end()
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        return broken(error, turns=len(gate.recorder.turns), warmup=gate.options.warmup)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[Any]:
    """The call report of a gated test gets the section and the summary's entry; a
    passed one whose gate failed becomes a failure (a failed body keeps its own)."""
    report = yield
    outcome = item.stash.get(OUTCOME, None) if call.when == "call" else None
    if outcome is not None:
        report.sections.append((SECTION, section_text(outcome)))
        report.user_properties.append((SUMMARY_PROPERTY, summary_entry(outcome)))
        if report.passed and outcome.failed:
            report.outcome = "failed"
            report.longrepr = failure_message(outcome)
    return report


@pytest.fixture(name=TURN_FIXTURE)
def leak_gate_turn_fixture(request: pytest.FixtureRequest) -> Callable[..., None]:
    """``leak_gate_turn(conversations=0, context_tokens=0)``: a barrier of the marked
    test, the engine idle; an error on a test without ``@pytest.mark.leak_gate``."""
    item = request.node
    if item.get_closest_marker(MARKER) is None:
        pytest.fail(
            f"the {TURN_FIXTURE} fixture records barriers of a test marked "
            f"@pytest.mark.{MARKER}, and {item.nodeid} is not; mark it (e.g. "
            f"@pytest.mark.{MARKER}(probe='engine')), or use the leak_gate fixture",
            pytrace=False,
        )

    def turn(*, conversations: int = 0, context_tokens: int = 0) -> None:
        gate = item.stash.get(GATE, None)
        if gate is None:
            raise RuntimeError(
                f"{TURN_FIXTURE}() records a barrier while the test body runs, "
                "after the baseline probe"
            )
        gate.turn(conversations=conversations, context_tokens=context_tokens)

    return turn


class GatedTests:
    """Every gated test's summary entry, in the order their call reports were logged
    (on the controller, under pytest-xdist: the entry travels on the report)."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, str]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call":
            self.entries += [
                (report.nodeid, value)
                for name, value in report.user_properties
                if name == SUMMARY_PROPERTY
            ]

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.entries:
            return
        terminalreporter.write_sep("=", SECTION)
        for nodeid, entry in self.entries:
            for line in summary_lines(nodeid, entry):
                terminalreporter.write_line(line)


# -- the explicit fixture -----------------------------------------------------------------
@pytest.fixture(name="leak_gate")
def leak_gate_fixture() -> Callable[..., Any]:
    """``with leak_gate(probe) as gate: ... gate.turn()``: fails the test on a leak."""
    return leak_gate
