"""Black-box usage gauges are judged on the run's own rise, not their level.

A server that served an earlier run may start this one with usage left over.
The trend test weighs a slope against the level the series reaches; with the
leftover in that level, a leak of a few pages per turn is too small a slope to
count. Less the value the run started at, the same leak is a clear rise.
"""

from __future__ import annotations

import pytest

from kvwatch.contracts import ProbeReport
from kvwatch.gate.verdicts.detectors import DETECTORS
from kvwatch.harness.recorder import RecorderOptions, TurnRecorder

USAGE = "engine_kv_usage"
CONVERSATIONS = 4


class GaugeSource:
    """A black-box target whose usage gauge is ``left_over`` plus ``leak`` per turn."""

    white_box = False

    def __init__(self, left_over: float, leak: float) -> None:
        self.value, self.leak = left_over, leak

    def gauges(self, series):
        return {name: self.value for name in series}

    def sleep(self, seconds: float) -> None:
        pass

    def answering(self) -> None:
        pass

    def probe(self) -> ProbeReport:
        raise AssertionError("a black-box source is never probed")

    def flush(self) -> bool:
        raise AssertionError("a black-box source is never flushed")


def _verdict(left_over: float, leak: float):
    source = GaugeSource(left_over, leak)
    options = RecorderOptions(warmup=2, usage_gauges=(USAGE,))
    recorder = TurnRecorder(source, options)
    recorder.start()
    for turn in range(10):
        source.value += leak
        recorder.barrier(turn, [{"conversations": CONVERSATIONS}], drain=False)
    return recorder, DETECTORS["gauge-trend"](recorder.record())


@pytest.mark.parametrize("left_over", [0.0, 0.6])
def test_a_small_leak_is_caught_whatever_an_earlier_run_left(left_over):
    recorder, verdict = _verdict(left_over, leak=0.004)
    assert verdict.failed, verdict
    first = recorder.turns[0].gauges[f"{USAGE}/conversation"]
    assert first == pytest.approx(0.004 / CONVERSATIONS)  # the rise, per conversation


@pytest.mark.parametrize("left_over", [0.0, 0.6])
def test_usage_that_stays_where_it_started_passes(left_over):
    _, verdict = _verdict(left_over, leak=0.0)
    assert not verdict.failed, verdict
