"""The gate's time profile: a run's wall time split at the recorder's marks, and
the engine thread's CPU over the run."""

from __future__ import annotations

from kvwatch.harness.time_spent import TimeSpent, barrier_phases, engine_cpu, load_phases


def test_the_load_phases_split_the_load_at_the_recorders_marks():
    # spawned at 100; baseline at 101; barriers at 103, 105 (warm-up), 108, 112; drained at 115
    phases = load_phases(100.0, 101.0, [103.0, 105.0, 108.0, 112.0], 2, 115.0, 116.5)
    assert phases == {
        "load_start_s": 1.0,
        "warmup_s": 4.0,
        "turns_s": 7.0,
        "drain_s": 3.0,
        "load_stop_s": 1.5,
    }
    assert sum(phases.values()) == 16.5  # nothing lost between the marks
    assert load_phases(100.0, None, [], 2, None, 101.0) == {}  # a broken run has no marks


def test_the_engine_cpu_of_a_run_is_its_difference():
    before = {"steps": 10, "step_s": 1.0, "watch_s": 0.5, "calls_s": 0.25}
    after = {"steps": 40, "step_s": 4.0, "watch_s": 2.0, "calls_s": 1.0}
    assert engine_cpu(before, after) == {
        "step_s": 3.0,
        "watch_s": 1.5,
        "calls_s": 0.75,
        "steps": 30,
    }


def test_time_spent_goes_to_json_and_back():
    spent = TimeSpent(run_s=9.5, warmup_s=2.25, steps=12, watch_s=0.5)
    assert TimeSpent.from_json(spent.to_json()) == spent
    assert TimeSpent.from_json(None) is None


def test_the_barriers_share_of_the_turns_is_their_waits_and_their_probes():
    assert barrier_phases([0.5, 1.25, 0.25], [2.0, 1.0, 1.5]) == {
        "settle_s": 2.0,
        "barrier_s": 4.5,
    }
    assert barrier_phases([], []) == {"settle_s": 0, "barrier_s": 0}
