"""Locust entry point.

Free-running users (``ChatUser``, ``SessionAgent``)::

    locust -f loadtests/locustfile.py --host URL ChatUser SessionAgent

The profiles' turn-based users run under ``kvwatch gate``, which writes a run
plan and starts ``locust -f ... --kvwatch-plan FILE <UserClass>``. With a
plan, this file wires the turn barrier on every runner, and the recorder
(the barrier action) on the coordinator: the master, or the local runner.
Every process counts its users' HTTP answers by status class
(``statuses.py``). A soak plan (``kvwatch gate --soak``) wires no barrier:
the users run free.
"""

from __future__ import annotations

import gevent
from locust import events, task
from locust.runners import WorkerRunner

from kvwatch.harness.plan import RunPlan
from kvwatch.loadtests.agents import (
    AbortStormUser,
    AgentTrieUser,
    RolloutUser,
    SlotCacheUser,
    StreamingSessionUser,
)
from kvwatch.loadtests.badinput import BadInputUser
from kvwatch.loadtests.barrier import END, TurnBarrier
from kvwatch.loadtests.chaos import ChaosUser
from kvwatch.loadtests.edges import EdgeUser
from kvwatch.loadtests.users import AgentUser, StreamingChatUser, sentence

__all__ = [
    "AbortStormUser",
    "AgentTrieUser",
    "BadInputUser",
    "ChaosUser",
    "ChatUser",
    "EdgeUser",
    "RolloutUser",
    "SessionAgent",
    "SlotCacheUser",
    "StreamingSessionUser",
]


class ChatUser(StreamingChatUser):
    """One-shot chats over a shared system prompt."""

    system = "You are the storage agent of a serving team. Answer briefly. " * 2

    @task
    def chat_once(self) -> None:
        messages = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": sentence(self.rng)},
        ]
        self.stream_chat(messages, name="chat")


class SessionAgent(AgentUser):
    pass


@events.init_command_line_parser.add_listener
def _arguments(parser) -> None:
    parser.add_argument(
        "--kvwatch-plan", default="", help="a kvwatch run plan (JSON); written by kvwatch gate"
    )


@events.init.add_listener
def _wire(environment, **kwargs) -> None:
    options = environment.parsed_options
    if options is None or not getattr(options, "kvwatch_plan", ""):
        return
    from kvwatch.loadtests.barrier_action import Recorder
    from kvwatch.loadtests.statuses import StatusCounts
    from kvwatch.loadtests.timings import TimingLog

    plan = RunPlan.load(options.kvwatch_plan)
    environment.kvwatch_plan = plan
    # this process's requests by status; a soak writes them to its record when Locust quits
    environment.kvwatch_status = StatusCounts(plan.record if plan.soak else None)
    environment.kvwatch_status.listen(environment.events)
    environment.kvwatch_timings = TimingLog()  # what each answered completion cost
    environment.kvwatch_timings.listen(environment.events)
    if plan.soak:
        return
    record = None if isinstance(environment.runner, WorkerRunner) else Recorder(plan)

    def action(turn: int, reports: list[dict]) -> None:
        record(turn, reports)
        if turn == END:
            gevent.spawn(environment.runner.quit)

    def stalled(reason: str) -> None:
        record.stalled(reason)
        gevent.spawn(environment.runner.quit)

    environment.kvwatch_barrier = TurnBarrier(
        environment, action, timeout=plan.turn_timeout, on_stall=stalled
    )
