"""The turn loop every profile's user runs, and the small pieces users share.

``TurnUser`` owns the loop, the same for every profile::

    on_start: setup()               (open sessions, build prompts)
    START barrier                   (the baseline is taken)
    for t in turns: turn(t), barrier t (drain, probe, scrape)
    finish()                        (close sessions)
    END barrier                     (flush, drain-to-baseline, every session the
                                     user opened is closed; the run quits)

At each barrier a user reports its live conversations, the context tokens
they hold, its process's request counts so far, and one greedy request
(prompt and output token ids) the gate may replay on a cache-off engine.

Under a soak plan (``kvwatch gate --soak``) the same users run free: one turn
per Locust task, so Locust's graceful stop lands between turns, and every
``turns`` turns the episode ends (``finish``, then a fresh ``setup``) so
contexts stay bounded and sessions open and close all along the run.

Every text is drawn from seeded RNGs: the shared system prompt and tool
schema from the run's seed, the rest from the seed and the user's index, so a
run is the same run again. The profiles' users are in ``agents.py``.
"""

from __future__ import annotations

import itertools
import random

import gevent
from locust import constant, task

from kvwatch.loadtests.barrier import END, START
from kvwatch.loadtests.users import StreamingChatUser, sentence


class TurnUser(StreamingChatUser):
    abstract = True
    wait_time = constant(0)

    def on_start(self) -> None:
        plan = getattr(self.environment, "kvwatch_plan", None)
        if plan is None:
            raise RuntimeError(
                f"{type(self).__name__} runs under kvwatch gate (--kvwatch-plan FILE)"
            )
        self.plan, self.model = plan, plan.model
        runner = self.environment.runner
        counter = self.environment.__dict__.setdefault("kvwatch_users", itertools.count())
        # unique across workers: the nth user of worker w is n * 1000 + w
        self.index = next(counter) * 1000 + getattr(runner, "worker_index", 0)
        self.rng = random.Random(f"{plan.seed}:{plan.profile}:{self.index}")
        shared = random.Random(f"{plan.seed}:shared")
        self.system = {"role": "system", "content": sentence(shared, 14, 16)}
        self.schema = {"role": "tool", "content": sentence(shared, 16, 18)}
        self.finished = False
        self.episode_turn = 0
        self.opened: list[str] = []  # every session id this user opened (agents.py)
        self.setup()

    @task
    def run_turns(self) -> None:
        if self.plan.soak:
            self._soak_turn()
            return
        barrier = self.environment.kvwatch_barrier
        barrier.wait(START, {})
        for t in range(self.plan.turns):
            self._fresh_connections()
            self._safely(self.turn, t)
            barrier.wait(t, self._barrier_report())
        self._safely(self._finish)
        # the sessions this user opened: the gate checks each is closed once drained
        barrier.wait(END, {**self._end_report(), "sessions": list(self.opened)})
        gevent.sleep(3600)  # the coordinator quits the run

    def _soak_turn(self) -> None:
        self._fresh_connections()
        if self.episode_turn == self.plan.turns:  # the episode is over: start afresh
            self._finish()
            self.environment.kvwatch_status.episode_ended(self.index)
            self.finished, self.episode_turn = False, 0
            self._safely(self.setup)
        self._safely(self.turn, self.episode_turn)
        self.episode_turn += 1

    def on_stop(self) -> None:
        self._finish()

    def _fresh_connections(self) -> None:
        """Start a turn on new connections. Between turns a pooled keep-alive
        connection idles for as long as the barrier (or the slowest request of
        the turn) takes, which on a loaded machine outlasts a server's keep-alive
        timeout (5 s in uvicorn's default, and vLLM's); a request sent just as
        the server closes it gets no answer, a failure of neither the server nor
        the engine."""
        self.client.close()

    def _finish(self) -> None:
        if not self.finished:
            self.finished = True
            self.finish()

    def _safely(self, fn, *args) -> None:
        """A broken turn is a failed request in the stats; the user goes on to the barrier."""
        try:
            fn(*args)
        except Exception as exc:
            self.environment.events.request.fire(
                request_type="TURN",
                name=type(self).__name__,
                response_time=0,
                response_length=0,
                exception=exc,
                context={},
            )

    def _barrier_report(self) -> dict:
        return {
            "conversations": self.conversations(),
            "context_tokens": self.context_tokens(),
            **self._end_report(),
        }

    def _end_report(self) -> dict:
        """This process's request counts so far: every request of this user's
        turn is done (the coordinator keeps each process's largest)."""
        process = str(getattr(self.environment.runner, "client_id", "local"))
        return {
            "process": process,
            "counts": self.environment.kvwatch_status.counts().to_json(),
            "timings": self.environment.kvwatch_timings.timings().to_json(),
        }

    # -- what a profile fills in ----------------------------------------------------------
    def setup(self) -> None:
        pass

    def turn(self, t: int) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        pass

    def conversations(self) -> int:
        return 0

    def context_tokens(self) -> int:
        return 0


def parallel(*calls) -> None:
    """Run calls side by side (one user's parallel requests); wait for every one,
    then raise the first error, if any."""
    jobs = gevent.joinall([gevent.spawn(c) for c in calls])
    for job in jobs:
        if job.exception is not None:
            raise job.exception


class Chat:
    """A stateless multi-turn chat: the client resends the whole history."""

    def __init__(self, messages: list[dict]) -> None:
        self.messages, self.tokens = list(messages), 0

    def step(self, user: TurnUser, text: str, *, name: str, max_tokens: int = 8) -> dict | None:
        messages = [*self.messages, {"role": "user", "content": text}]
        data = user.chat(messages, name=name, max_tokens=max_tokens)
        if data is not None:
            reply = data["choices"][0]["message"]["content"]
            self.messages = [*messages, {"role": "assistant", "content": reply}]
            self.tokens = data["usage"]["total_tokens"]
        return data
