"""An engine that never gets idle: the recorder waits for it once, then judges.

A request the engine keeps live forever (here: paused and never resumed) is a
leak of the request itself. The run must end as a failed drain rule naming
the live request, not as a broken run, and only the first barrier may wait
the drain timeout out: a run of many turns must not wait once per turn.
"""

from __future__ import annotations

import time

import pytest

from kvwatch.contracts import FindingKind, finding
from kvwatch.engine import Engine, SamplingParams
from kvwatch.gate.verdicts.detectors import requests
from kvwatch.gate.verdicts.detectors.allocator import drain_rule
from kvwatch.harness.recorder import RecorderOptions, TurnRecorder


class EngineSource:
    """The recorder's view of an in-process engine; counts the waits it asks for."""

    white_box = True

    def __init__(self, engine: Engine) -> None:
        self.engine, self.waits = engine, 0

    def probe(self):
        return self.engine.probe()

    def flush(self) -> bool:
        self.engine.flush_cache()
        return True

    def sleep(self, seconds: float) -> None:
        self.waits += 1

    def answering(self) -> None:
        pass

    def finished(self) -> dict:
        return {"requests": [], "finished": 0, "dropped": 0}

    def gauges(self, series):
        return {}


def _run(stuck: bool) -> tuple[TurnRecorder, list[int]]:
    engine = Engine()
    source = EngineSource(engine)
    recorder = TurnRecorder(source, RecorderOptions(warmup=1, drain_timeout=0.2))
    recorder.start()
    rid = engine.add_request("a request that stops half-way " * 4, SamplingParams(max_tokens=8))
    while engine.request_info(rid).output_tokens < 2:
        engine.step()
    engine.pause(rid)
    if not stuck:
        engine.resume(rid)
        while not engine.request_info(rid).done:
            engine.step()
        engine.take(rid)
    waits = []
    for turn in range(4):
        before = source.waits
        recorder.barrier(turn)
        waits.append(source.waits - before)
    recorder.finish()
    return recorder, waits


@pytest.mark.parametrize("stuck", [True, False])
def test_a_request_live_forever_fails_the_drain_rule_after_one_wait(stuck):
    recorder, waits = _run(stuck)
    record = recorder.record()
    assert record.error is None  # not a broken run: a finding
    verdict = drain_rule(record)
    if stuck:
        assert waits[0] > 0 and waits[1:] == [0, 0, 0]
        assert verdict is not None and verdict.failed
        assert any("1 live requests left, 0 before" in e.detail for e in verdict.evidence)
    else:
        assert waits == [0, 0, 0, 0]
        assert verdict is None  # the rule found nothing left


class OnceSource(EngineSource):
    """A server that reports a finding once only, in whichever probe comes next
    (as kvwatch's server does an abandoned request): here, the first probe taken
    while a request is still live, during a drain."""

    def __init__(self, engine: Engine, rid: str, when: str) -> None:
        super().__init__(engine)
        self.rid, self.when, self.told = rid, when, False

    def probe(self):
        report = self.engine.probe()
        info = self.engine.request_info(self.rid) if self.rid else None
        live = info is not None and not info.done
        if live and not self.told and self.when == self.phase:
            self.told = True
            said = finding(FindingKind.ABANDONED, None, [], f"request {self.rid} still runs")
            return report._replace(findings=(*report.findings, said))
        return report

    def sleep(self, seconds: float) -> None:
        self.engine.step()  # the engine works on while the recorder waits for it


def _told_during_a_drain(when: str):
    """A request live across a barrier's drain (``when="barrier"``) or across the
    drain at the run's end (``"finish"``); the server tells of it once, then."""
    engine = Engine()
    params = SamplingParams(max_tokens=6)
    source = OnceSource(engine, "", when)
    source.phase = "start"
    recorder = TurnRecorder(source, RecorderOptions(warmup=1, drain_timeout=60))
    recorder.start()
    source.rid = engine.add_request("a request nobody reads any more " * 3, params)
    source.phase = "barrier"
    for turn in range(2):
        recorder.barrier(turn)
    source.rid = engine.add_request("another one after the last barrier " * 3, params)
    source.phase = "finish"
    recorder.finish()
    assert source.told
    return recorder.record()


def test_a_finding_told_once_while_a_barrier_waits_for_idle_is_kept():
    verdict = requests.detect(_told_during_a_drain("barrier"))
    assert verdict.failed and verdict.first_turn == 0, verdict
    assert "still runs" in verdict.evidence[0].detail


def test_a_finding_told_once_while_the_run_drains_at_its_end_is_kept():
    record = _told_during_a_drain("finish")
    verdict = requests.detect(record)
    assert verdict.failed and verdict.after_drain, verdict
    assert "still runs" in verdict.evidence[0].detail


class SlowProbeSource(EngineSource):
    """Each probe takes at least 10 ms of wall time."""

    def probe(self):
        time.sleep(0.01)
        return super().probe()


def test_a_barrier_splits_its_time_into_the_wait_for_idle_and_its_probes():
    """A barrier's wait for the engine to get idle is its ``settle_s``; the probes it
    takes at the idle engine are its ``barrier_s``. Both are lower bounds that hold on
    any machine: a stuck request makes the first barrier wait out the drain timeout,
    and every barrier takes at least one 10 ms probe after its wait."""
    engine = Engine()
    # the warm-up's last barrier reads the settled gauges too (a gauge preset's)
    options = RecorderOptions(warmup=1, drain_timeout=0.2, settled_gauges=("pages",))
    recorder = TurnRecorder(SlowProbeSource(engine), options)
    recorder.start()
    rid = engine.add_request("a request that stops half-way " * 4, SamplingParams(max_tokens=8))
    while engine.request_info(rid).output_tokens < 2:
        engine.step()
    engine.pause(rid)
    stuck = recorder.barrier(0)
    engine.resume(rid)
    while not engine.request_info(rid).done:
        engine.step()
    engine.take(rid)
    idle = recorder.barrier(1)
    assert stuck.settle_s >= 0.2 and stuck.barrier_s >= 0.01
    assert idle.barrier_s >= 0.01 and idle.settle_s < 0.2
