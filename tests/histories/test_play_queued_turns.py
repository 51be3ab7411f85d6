"""The player's account of sessions whose next turn queues behind the one before
(``session_queues_turns``) and keeps a finished turn but its last token
(``session_keeps = "finished-less-last"``): vLLM's streaming input. A stand-in loop
keeps that contract (one turn of a session runs at a time, one token a step); the
same loop building a queued turn on what the session held when it was sent fails
``content``, so the check can fail here."""

from __future__ import annotations

from typing import Any

from kvwatch.contracts import EngineStats, ProbeReport, QueueReport, RootRefs, TreeReport
from kvwatch.histories.checks import CONTENT, judge
from kvwatch.histories.ops import CLOSE, OPEN, TURN, History, Op
from kvwatch.histories.play import play
from kvwatch.targets.driver.engine_loop import FINISHED, EngineLoop, Outcome
from kvwatch.targets.driver.step_probe import StepProbe


class QueueingLoop(EngineLoop):
    session_keeps = "finished-less-last"
    session_queues_turns = True

    def __init__(self, built_at_send: bool = False) -> None:
        super().__init__()
        self.steps, self.built_at_send = 0, built_at_send
        self.held: dict[str, tuple[int, ...]] = {}  # session -> its tokens so far
        self.queues: dict[str, list[dict]] = {}  # session -> its turns not ended, in order
        self.turns: dict[str, dict] = {}

    def submit(self, rid: Any, prompt: list[int], max_new: int, **options: Any) -> Any:
        sid = options["session_id"]
        turn = {"rid": rid, "own": tuple(prompt), "max": max_new, "input": None, "out": []}
        if self.built_at_send:  # the bug: built on the session as it was when sent
            turn["input"] = self.held[sid] + turn["own"]
        self.queues[sid].append(turn)
        self.turns[rid] = turn

    def open_session(self, session_id: str) -> None:
        self.held[session_id], self.queues[session_id] = (), []

    def close_session(self, session_id: str) -> None:  # queued turns still run
        pass

    def abort(self, rid: Any) -> None:
        raise AssertionError("these histories abort nothing")

    def step(self) -> None:
        self.steps += 1
        for sid, queue in self.queues.items():
            if not queue:
                continue
            turn = queue[0]
            if turn["input"] is None:
                turn["input"] = self.held[sid] + turn["own"]
            turn["out"].append(32 + (len(turn["input"]) + len(turn["out"])) % 90)
            if len(turn["out"]) == turn["max"]:
                queue.pop(0)
                self.held[sid] = turn["input"] + tuple(turn["out"][:-1])
                self.outcomes.append(Outcome(rid=turn["rid"], status=FINISHED, step=self.steps))
        self.notify()

    def flush(self) -> bool:
        return self.idle()

    def idle(self) -> bool:
        return not any(self.queues.values())

    def input_of(self, rid: Any) -> tuple[int, ...] | None:
        return self.turns[rid]["input"]

    def output_of(self, rid: Any) -> tuple[int, ...]:
        return tuple(self.turns[rid]["out"])

    def admitted(self, rid: Any) -> bool:
        return self.turns[rid]["input"] is not None

    def stage(self, rid: Any) -> str | None:
        turn = self.turns[rid]
        live = [q for q in self.queues.values() if turn in q]
        return None if not live else ("decoding" if live[0][0] is turn else "queued")


class QuietProbe(StepProbe):
    def report(self) -> ProbeReport:
        stats = EngineStats(
            step=0, live_requests=0, live_sessions=0, groups={}, root_refs=RootRefs(0, 0),
            tree=TreeReport(nodes=0, snapshots={}, host_snapshots=0, interior_snapshots={}),
            queue=QueueReport(waiting=0, running=0, retracted=0, paused=0), record_bytes=0,
        )  # fmt: skip
        return ProbeReport(stats=stats, findings=(), bounds={}, registries={})


def _turn(rid: str, at: int, tokens: range, max_new: int, after: str = "") -> Op:
    return Op(turn=0, at=at, kind=TURN, rid=rid, session="s", tokens=tuple(tokens),
              max_new=max_new, after=after)  # fmt: skip


# t1 runs; t2 is sent beside it (queued behind it); t3 waits for t2's answer; the session
# is closed while t2 still waits
HISTORY = History(
    engine="stand-in",
    seed=0,
    ops=(
        Op(turn=0, at=0, kind=OPEN, session="s"),
        _turn("t1", 0, range(40, 60), 4),
        _turn("t2", 1, range(60, 70), 3),
        Op(turn=0, at=2, kind=CLOSE, session="s"),
        Op(turn=1, at=0, kind=OPEN, session="u"),
        Op(turn=1, at=0, kind=TURN, rid="u1", session="u", tokens=tuple(range(70, 75)), max_new=2),
        Op(
            turn=1,
            at=0,
            kind=TURN,
            rid="u2",
            session="u",
            tokens=tuple(range(75, 80)),
            max_new=2,
            after="u1",
        ),
    ),
)


def test_a_queued_turn_builds_on_the_turns_before_it_less_their_last_token():
    loop = QueueingLoop()
    played = play(loop, QuietProbe(), HISTORY)
    verdict = judge(played, loop.unasked, None)
    assert not verdict.findings, verdict.findings
    t1, t2 = played.ended["t1"], played.ended["t2"]
    assert played.sent["t2"].beside == "decoding"  # sent while t1 ran
    assert played.sent["t2"].expected == t1.input + t1.output[:-1] + tuple(range(60, 70))
    assert t2.status == FINISHED  # queued before the close, it still ran
    u1 = played.ended["u1"]
    assert played.sent["u2"].expected == u1.input + u1.output[:-1] + tuple(range(75, 80))


def test_a_loop_that_builds_a_queued_turn_on_the_session_as_sent_fails_content():
    loop = QueueingLoop(built_at_send=True)
    verdict = judge(play(loop, QuietProbe(), HISTORY), loop.unasked, None)
    assert [(f.check, f.rid) for f in verdict.findings] == [(CONTENT, "t2")]
