"""The shared in-process driver (``kvwatch.targets.driver``) on a loop made for the test.

``FakeLoop`` keeps the ``EngineLoop`` contract with no engine behind it: a request
runs for as many steps as it asks tokens, an abort ends it at once, and a request
submitted as ``doomed`` is ended by the "engine" itself. That is enough to show
what every engine run in process gets from the driver: operations placed at chosen
steps and triggered by what a client sees, the clients giving up on a stalled loop,
a loop that never gets idle breaking the run, the requests counted as clients count
them, the recorder's flush going through the loop, and a loop judged where it broke.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from probes import make_probe

from kvwatch.contracts import ProbeReport
from kvwatch.targets.driver.drive import LoopSource, counts, record_run
from kvwatch.targets.driver.engine_loop import ABORTED, FINISHED, EngineLoop, Outcome
from kvwatch.targets.driver.step_probe import StepProbe
from kvwatch.targets.driver.workload import IdleRule, Schedule, TurnStats, Workload, run_until_idle

KILLED = "killed"  # the fake engine's own end of a request


class FakeLoop(EngineLoop):
    engine = "Fake"
    step_word = "tick"
    on_purpose = (ABORTED, "dropped")
    unasked = KILLED

    def __init__(self, *, stall_from: int | None = None, raise_at: int | None = None) -> None:
        super().__init__()
        self.steps, self.left, self.log = 0, {}, []
        self.stall_from, self.raise_at = stall_from, raise_at
        self.flushes, self.closed, self.sessions = 0, False, set()

    def submit(self, rid: Any, prompt: list[int], max_new: int, **options: Any) -> Any:
        self.log.append(f"submit {rid}")
        self.left[rid] = -1 if options.get("doomed") else max_new
        return rid

    def abort(self, rid: Any) -> None:
        self.log.append(f"abort {rid}")
        if self.left.pop(rid, None) is not None:
            self.outcomes.append(Outcome(rid=rid, status=ABORTED, step=self.steps))

    def step(self) -> None:
        self.steps += 1
        self.log.append(f"step {self.steps}")
        if self.steps == self.raise_at:
            raise ValueError("the engine broke")
        for rid in list(self.left):
            self.left[rid] -= 1
            if self.left[rid] <= 0:
                status = KILLED if self.left.pop(rid) < 0 else FINISHED
                self.outcomes.append(
                    Outcome(rid=rid, status=status, step=self.steps, why="out of room")
                )
        self.notify()

    def flush(self) -> bool:
        if not self.idle():
            return False
        self.flushes += 1
        return True

    def open_session(self, session_id: str) -> None:
        self.sessions.add(session_id)

    def idle(self) -> bool:
        return not self.left

    def live_rids(self) -> list[Any]:
        return list(self.left)

    def stalled(self) -> bool:
        return self.stall_from is not None and self.steps >= self.stall_from

    def session_open(self, session_id: str) -> bool:
        return session_id in self.sessions

    def failure(self, ended: Outcome) -> dict:
        return {"name": ended.rid, "status": 0, "error": f"killed at tick {ended.step}"}

    def close(self) -> None:
        self.closed = True


RULE = IdleRule(max_steps=50, stuck="the fake loop did not get idle in {n} ticks")


def test_operations_run_just_before_their_step_and_triggers_fire_once_when_due():
    loop = FakeLoop()
    loop.submit("a", [1], 3)
    schedule = Schedule()
    schedule.before_step(2, lambda: loop.submit("late", [1], 1))
    schedule.once(lambda: loop.steps >= 1, lambda: loop.abort("a"))
    assert run_until_idle(loop, schedule, RULE) == 3
    assert loop.log == [
        "submit a",
        "step 1",
        "abort a",  # due once the client saw a step: before the next one
        "step 2",
        "submit late",  # scheduled before step index 2: the third step takes it
        "step 3",
    ]
    assert schedule.when == [] and [o.status for o in loop.outcomes] == [ABORTED, FINISHED]


def test_scheduled_steps_keep_an_idle_loop_stepping_until_they_ran():
    loop = FakeLoop()
    schedule = Schedule()
    schedule.before_step(3, lambda: loop.submit("x", [1], 1))
    run_until_idle(loop, schedule, RULE)
    assert loop.log == ["step 1", "step 2", "step 3", "submit x", "step 4"]


def test_a_stalled_loops_clients_give_up_once_and_one_idle_step_follows():
    loop = FakeLoop(stall_from=2)
    for rid in ("a", "b"):
        loop.submit(rid, [1], 10)
    rule = IdleRule(max_steps=50, stuck="stuck", give_up=True, idle_step=True)
    assert run_until_idle(loop, None, rule) == 3  # the step that takes the aborts
    assert loop.log[2:] == ["step 1", "step 2", "abort a", "abort b", "step 3", "step 4"]
    without = FakeLoop(stall_from=2)
    without.submit("a", [1], 10)
    run_until_idle(without, None, RULE)  # no give-up: it runs to the end
    assert [o.status for o in without.outcomes] == [FINISHED] and without.steps == 10


def test_a_loop_that_never_gets_idle_breaks_the_run_with_the_rules_message():
    loop = FakeLoop()
    loop.submit("a", [1], 10**6)
    with pytest.raises(RuntimeError, match="did not get idle in 50 ticks"):
        run_until_idle(loop, None, RULE)
    assert loop.steps == 50


def test_requests_are_counted_as_clients_count_them_with_the_engines_failures_named():
    loop = FakeLoop()
    loop.outcomes = [
        Outcome(rid="a", status=FINISHED, step=1),
        Outcome(rid="b", status=ABORTED, step=2),
        Outcome(rid="c", status="dropped", step=3),
        Outcome(rid="d", status=KILLED, step=4),
    ]
    got = counts(loop)
    assert got["status"] == {"2xx": 1, "4xx": 2} and got["failed"] == 1
    assert got["first_failures"] == [{"name": "d", "status": 0, "error": "killed at tick 4"}]


class Probe(StepProbe):
    def __init__(self, loop: FakeLoop) -> None:
        super().__init__()
        self.loop, self.reports = loop, 0
        loop.observers.append(self.remember)

    def report(self) -> ProbeReport:
        self.reports += 1
        return make_probe(step=self.loop.steps, live_requests=len(self.loop.left))

    def holdings(self):
        return []


class Turns(Workload):
    name = "turns"
    idle_rule: ClassVar[IdleRule] = RULE

    def start(self, loop: FakeLoop) -> None:
        self.open(loop, "s0")

    def turn(self, loop: FakeLoop, t: int) -> TurnStats:
        loop.submit(f"ok{t}", self.tokens(3), 2)
        loop.submit(f"doomed{t}", self.tokens(3), 2, doomed=True)
        schedule = Schedule()
        schedule.before_step(1, lambda: loop.abort(f"ok{t}"))
        self.run(loop, schedule)
        self.histories[f"c{t}"] = self.tokens(4)
        return self.stats()


def test_a_recorded_run_has_a_barrier_a_turn_its_counts_and_the_loops_flush():
    made: list[FakeLoop] = []

    def make() -> FakeLoop:
        made.append(FakeLoop())
        return made[-1]

    lines: list[str] = []
    record, loop = record_run(
        make, Probe, Turns(c=1, seed=3), turns=2, warmup=0, where_it_broke=str, say=lines.append
    )
    assert loop is made[0] and loop.closed and loop.flushes == 1
    assert [t.turn for t in record.turns] == [0, 1] and record.error is None
    assert [t.conversations for t in record.turns] == [1, 2]
    assert record.turns[-1].requests.status == {"2xx": 0, "4xx": 2}
    assert record.turns[-1].requests.failed == 2
    assert record.sessions_opened == 1 and record.sessions_left == ("s0",)
    assert lines[-1].endswith("(2 of 2 turns, tick 4)")


def test_a_loop_whose_constructor_breaks_gives_an_empty_record_with_the_reason():
    def broken() -> FakeLoop:
        raise OSError("no engine here")

    record, loop = record_run(
        broken, Probe, Turns(), turns=2, warmup=0, where_it_broke=lambda e: f"broke: {e}"
    )
    assert loop is None and record.turns == () and record.error == "broke: no engine here"


@pytest.mark.parametrize("judged", [False, True])
def test_a_loop_judged_where_it_broke_is_probed_as_it_was_left(judged, monkeypatch):
    monkeypatch.setattr(FakeLoop, "judged_where_it_broke", judged)
    record, loop = record_run(
        lambda: FakeLoop(raise_at=3),
        Probe,
        Turns(c=1),
        turns=3,
        warmup=0,
        where_it_broke=lambda e: f"the fake broke: {e}",
    )
    assert loop.closed and record.error.startswith("the fake broke: the engine broke")
    # turn 0 took two steps; turn 1 broke at the third: probed undrained only if judged
    assert [t.turn for t in record.turns] == ([0, 1] if judged else [0])
    assert (record.requests is not None) == judged


def test_the_loop_source_asks_the_loop_for_the_flush_and_the_sessions():
    loop = FakeLoop()
    probe = Probe(loop)
    source = LoopSource(probe, loop)
    loop.open_session("kept")
    assert source.session_open("kept") and not source.session_open("gone")
    loop.submit("a", [1], 1)
    assert source.flush() and loop.flushes == 0  # busy: the loop refused, nothing done
    loop.step()
    source.flush()
    assert loop.flushes == 1 and source.probe().step == 1
    source.watch()
    loop.submit("b", [1], 1)
    loop.step()
    assert probe.reports == 2 and source.latched() == []  # clean reports are not kept
