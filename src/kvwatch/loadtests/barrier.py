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

A watchdog on the coordinator gives up when no barrier completes for
``timeout`` seconds (a wedged server, a lost worker) and calls ``on_stall``,
so a broken run ends with an error instead of hanging.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable

import gevent
from gevent.event import Event
from locust.runners import MasterRunner, WorkerRunner

ARRIVE, GO = "kvwatch:arrive", "kvwatch:go"
START, END = -1, -2  # before the first turn (baseline) and after the last (drain)

Action = Callable[[int, list[dict]], None]


class TurnBarrier:
    def __init__(
        self,
        environment,
        action: Action,
        *,
        timeout: float = 0.0,
        on_stall: Callable[[str], None] | None = None,
    ) -> None:
        self.runner = environment.runner
        self.action = action  # runs on the coordinator (master or local runner) only
        self.released: defaultdict[int, Event] = defaultdict(Event)
        self.arrivals: defaultdict[int, list[dict]] = defaultdict(list)
        self.progress_at = time.monotonic()
        self.done = False
        if not isinstance(self.runner, MasterRunner):  # users live here
            self.runner.register_message(GO, self._go)
        if not isinstance(self.runner, WorkerRunner):  # the coordinator lives here
            self.runner.register_message(ARRIVE, self._arrive)
            if timeout and on_stall is not None:
                gevent.spawn(self._watch, timeout, on_stall)

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
            self.progress_at = time.monotonic()
            self.done = turn == END
            if turn != END:  # after the last barrier the coordinator quits the run
                self.runner.send_message(GO, {"turn": turn})

    def _watch(self, timeout: float, on_stall: Callable[[str], None]) -> None:
        while not self.done:
            gevent.sleep(1.0)
            if time.monotonic() - self.progress_at > timeout:
                waiting = {t: len(a) for t, a in self.arrivals.items()}
                on_stall(
                    f"no turn barrier completed in {timeout:.0f} s "
                    f"(arrivals so far {waiting or 'none'}, of {self.runner.target_user_count})"
                )
                return

    def _go(self, environment, msg, **kwargs) -> None:
        self.released[msg.data["turn"]].set()
