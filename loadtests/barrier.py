"""A turn barrier for Locust users, in one process or across distributed workers.

Every user does turn t, then waits; when all of them have arrived, the
coordinator runs the barrier action (drain, probe, scrape) and releases turn
t + 1. It rides on Locust's own runner messages, so the same code spans
workers::

    user (any worker) --kvwatch:arrive {turn, report}--> master (or local runner)
                                                         all users in? run the action
    user (any worker) <--kvwatch:go {turn}-------------- master

With a ``LocalRunner``, ``send_message`` calls the handler in-process, so the
local case is the distributed one with no network in between. The expected
head count is the runner's ``target_user_count`` (``-u``), which the master
knows for all workers together.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import gevent
from gevent.event import Event
from locust.runners import MasterRunner, WorkerRunner

ARRIVE, GO = "kvwatch:arrive", "kvwatch:go"
START, END = -1, -2  # before the first turn (baseline) and after the last (drain)

Action = Callable[[int, list[dict]], None]


class TurnBarrier:
    def __init__(self, environment, action: Action) -> None:
        self.runner = environment.runner
        self.action = action  # runs on the coordinator (master or local runner) only
        self.released: defaultdict[int, Event] = defaultdict(Event)
        self.arrivals: defaultdict[int, list[dict]] = defaultdict(list)
        if not isinstance(self.runner, MasterRunner):  # users live here
            self.runner.register_message(GO, self._go)
        if not isinstance(self.runner, WorkerRunner):  # the coordinator lives here
            self.runner.register_message(ARRIVE, self._arrive)

    def wait(self, turn: int, report: dict) -> None:
        """Arrive at ``turn``'s barrier with this user's report; block until released."""
        self.runner.send_message(ARRIVE, {"turn": turn, "report": report})
        self.released[turn].wait()

    def _arrive(self, environment, msg, **kwargs) -> None:
        turn = msg.data["turn"]
        self.arrivals[turn].append(msg.data["report"])
        if len(self.arrivals[turn]) >= self.runner.target_user_count:
            # off the message loop: the action takes seconds, heartbeats must go on
            gevent.spawn(self._complete, turn, self.arrivals.pop(turn))

    def _complete(self, turn: int, reports: list[dict]) -> None:
        try:
            self.action(turn, reports)
        finally:
            if turn != END:  # after the last barrier the coordinator quits the run
                self.runner.send_message(GO, {"turn": turn})

    def _go(self, environment, msg, **kwargs) -> None:
        self.released[msg.data["turn"]].set()
