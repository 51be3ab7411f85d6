"""Profiles side by side (``--jobs``): the runs come back in the plan's order
whatever order the lanes end in, a target whose profiles share an engine runs
one at a time, and an interrupt stops every lane and keeps what finished."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import NamedTuple

import pytest

from kvwatch.gate.options import GateOptions
from kvwatch.gate.pipeline import EXIT_INTERRUPTED, run_gate
from kvwatch.harness.run_record import RunRecord, Signal
from kvwatch.harness.target import Served, Target


class Load(NamedTuple):
    name: str
    seconds: float  # how long each of its runs takes
    turns: int = 6


class Recorded(Served):
    def __init__(self, target: Lanes, profile: Load) -> None:
        self.target, self.profile = target, profile

    def run(self, spec) -> RunRecord:
        with self.target.lock:
            self.target.running += 1
            self.target.most = max(self.target.most, self.target.running)
        try:
            if self.target.interrupt_at == (self.profile.name, spec.concurrency):
                # Ctrl-C: the signal reaches the main thread, which waits on the lanes
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            time.sleep(self.profile.seconds)
            return RunRecord(turns=(), error=f"{self.profile.name} c={spec.concurrency} ran")
        finally:
            with self.target.lock:
                self.target.running -= 1
                self.target.ended.append((self.profile.name, spec.concurrency))


class Lanes(Target):
    name = "lanes"
    signals = frozenset({Signal.REQUESTS})

    def __init__(self, independent: bool, interrupt_at=None) -> None:
        self.independent_profiles = independent
        self.interrupt_at = interrupt_at
        self.lock = threading.Lock()
        self.running = self.most = 0
        self.ended: list[tuple[str, int]] = []
        self.stopped: list[str] = []

    def profiles(self):
        return {p.name: p for p in (Load("slow", 0.3), Load("quick", 0.02), Load("mid", 0.1))}

    @contextlib.contextmanager
    def serving(self, profile, progress):
        try:
            yield Recorded(self, profile)
        finally:
            self.stopped.append(profile.name)


def gate(tmp_path, target, jobs):
    lines = []
    opts = GateOptions(
        concurrency=(1, 8),
        out=tmp_path,
        jobs=jobs,
        report=False,
        progress=lines.append,
        result=lines.append,
    )
    summary, code = run_gate(opts, target)
    return summary, code, lines


PLAN = [("slow", 1), ("slow", 8), ("quick", 1), ("quick", 8), ("mid", 1), ("mid", 8)]


def test_lanes_return_the_runs_in_the_plans_order_though_they_end_in_another(tmp_path):
    target = Lanes(independent=True)
    summary, _, lines = gate(tmp_path, target, jobs=2)
    assert target.most == 2  # two profiles were served at once
    assert target.ended != PLAN  # quick and mid ended while slow still ran
    assert [(r.profile, r.concurrency) for r in summary.runs] == PLAN
    assert [r.error for r in summary.runs] == [f"{p} c={c} ran" for p, c in PLAN]
    assert sorted(target.stopped) == ["mid", "quick", "slow"]
    # each indented line names its run, since the other lane's lines come between
    assert any(line.startswith("[") and "quick c=1" in line for line in lines), lines


def test_a_target_whose_profiles_share_an_engine_runs_them_one_at_a_time(tmp_path):
    target = Lanes(independent=False)
    summary, _, _ = gate(tmp_path, target, jobs=4)
    assert target.most == 1
    assert target.ended == PLAN
    assert [(r.profile, r.concurrency) for r in summary.runs] == PLAN


def test_one_lane_per_core_by_default_and_never_more_than_the_profiles():
    assert GateOptions(jobs=3).lanes(True, 8) == 3
    assert GateOptions(jobs=16).lanes(True, 2) == 2
    assert GateOptions(jobs=16).lanes(False, 8) == 1
    assert GateOptions().lanes(True, 64) >= 1
    with pytest.raises(ValueError, match="--jobs"):
        GateOptions(jobs=0).validate()


def test_an_interrupt_stops_every_lane_and_keeps_the_finished_runs(tmp_path):
    target = Lanes(independent=True, interrupt_at=("mid", 1))
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        summary, code, _ = gate(tmp_path, target, jobs=2)
    finally:
        signal.signal(signal.SIGINT, handler)
    assert code == EXIT_INTERRUPTED
    assert summary.interrupted
    ran = [(r.profile, r.concurrency) for r in summary.runs]
    assert ran == [run for run in PLAN if run in ran]  # still in the plan's order
    assert ("mid", 8) not in ran  # the interrupted lane started nothing after
    assert sorted(target.stopped) == sorted({p for p, _ in target.ended})  # every server stopped
