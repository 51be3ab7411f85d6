"""The gate's console: progress with an estimate, and every failure with its evidence."""

from __future__ import annotations

from kvwatch.gate.outputs.console import result_lines, told
from kvwatch.gate.verdicts import judge as verdicts
from kvwatch.gate.verdicts.detectors.verdict import Evidence, Verdict, fail, passed
from kvwatch.harness.progress import HEARTBEAT_S, Progress, duration, turn_line


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_progress_lines_carry_elapsed_time_and_an_estimate_from_the_pace_so_far():
    clock, lines = Clock(), []
    progress = Progress([("p", 1), ("p", 8), ("q", 1)], lines.append, clock)
    progress.run_started("p", 1)
    assert lines[-1] == "[1/3] p c=1 (0s elapsed)"  # nothing finished: no estimate yet
    clock.now += 30  # c = 1 weighs 1.5: 20 s per unit
    told(
        progress,
        verdicts.RunResult(
            profile="p",
            concurrency=1,
            turns=6,
            requests=10,
            errors=0,
            verdicts={"allocator": passed("allocator")},
        ),
    )
    progress.run_started("p", 8)
    # left: c = 8 (weight 5) and c = 1 (1.5) at 20 s each
    assert lines[-1] == "[2/3] p c=8 (30s elapsed, about 2m10s left)"
    clock.now += HEARTBEAT_S - 1
    progress.heartbeat("waiting for turn 0 of 6")
    assert lines[-1].startswith("[2/3]")  # not silent for long enough yet
    clock.now += 1
    progress.heartbeat("waiting for turn 0 of 6")
    assert lines[-1] == "    ... waiting for turn 0 of 6 (1m00s elapsed)"
    assert duration(3725) == "1h02m"


def test_turns_are_numbered_from_0_as_in_the_summary():
    line = turn_line({"turn": 0, "conversations": 2, "probes": 5, "flagged": 1, "elapsed": 4.5}, 6)
    assert line == "turn 0: 2 conversations, 1 of 5 probes with findings (1 of 6 turns, 4.5 s)"
    assert turn_line({"turn": "end", "elapsed": 9.0}, 6).startswith("sessions closed, drained")


def test_every_failed_detector_prints_its_evidence_with_when_it_failed():
    during = fail(
        "allocator",
        3,
        [Evidence(group="full.kv", pages=(), detail="full.kv: 4 pages held by no live holder")],
    )
    drained = Verdict(
        detector="heap",
        verdict="fail",
        first_turn=6,
        evidence=(Evidence(group=None, pages=(), detail="engine/x.py:9: 4096 bytes left"),),
        after_drain=True,
    )
    result = verdicts.RunResult(
        profile="p",
        concurrency=2,
        turns=6,
        requests=40,
        errors=1,
        verdicts={"allocator": during, "heap": drained, "tree": passed("tree")},
    )
    assert result_lines(result) == [
        "40 requests, 1 failed",
        "FAIL allocator at turn 3: full.kv: 4 pages held by no live holder",
        "FAIL heap after the drain: engine/x.py:9: 4096 bytes left",
    ]
    clean = result._replace(verdicts={"tree": passed("tree")}, errors=0)
    assert result_lines(clean) == ["40 requests, 0 failed; every detector passed"]
    # a run that broke and was never judged says only why; one that broke part way
    # keeps its findings, then says why it broke
    never = result._replace(error="the engine exited", verdicts={})
    assert result_lines(never) == ["ERROR: the engine exited"]
    assert result_lines(result._replace(error="drain timed out"))[-1] == "ERROR: drain timed out"
    crashed = result._replace(
        verdicts={
            "tree": Verdict(
                detector="tree",
                verdict="error",
                first_turn=None,
                evidence=(
                    Evidence(group=None, pages=(), detail="the detector raised KeyError: 3"),
                ),
            )
        }
    )
    assert result_lines(crashed) == [
        "40 requests, 1 failed",
        "ERROR tree raised: the detector raised KeyError: 3",
    ]
