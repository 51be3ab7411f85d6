"""The profiles' users: each does one turn of its shape, then waits at the barrier.

``TurnUser`` owns the loop, the same for every profile::

    on_start: setup()               (open sessions, build prompts)
    START barrier                   (the baseline is taken)
    for t in turns: turn(t), barrier t (drain, probe, scrape)
    finish()                        (close sessions)
    END barrier                     (flush, drain-to-baseline, replays; the run quits)

At each barrier a user reports its live conversations, the context tokens
they hold, and one greedy request (prompt and output token ids) the recorder
may replay on a cold cache.

Under a soak plan (``kvwatch gate --soak``) the same users run free: one turn
per Locust task, so Locust's graceful stop lands between turns, and every
``turns`` turns the episode ends (``finish``, then a fresh ``setup``) so
contexts stay bounded and sessions open and close all along the run. Every text is drawn from seeded RNGs: the shared
system prompt and tool schema from the run's seed, the rest from the seed and
the user's index, so a run is the same run again.
"""

from __future__ import annotations

import itertools
import random

import gevent
from locust import constant, task

from kvwatch.loadtests.barrier import END, START
from kvwatch.loadtests.users import StreamingChatUser, sentence

CLOSE_TRIES = 50  # x 0.1 s: a cut turn of a session may still be aborting
# A hedged tool result is pushed out once it has computed two snapshot intervals
# (the engine's 64-token big pages) past its cached prefix, so it owns state, and
# held on the host tier long enough for its hedge to pass it.
RETRACT_AFTER, HOLD_STEPS = 128, 256


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
        self.candidates: list[list] = []
        self.finished = False
        self.episode_turn = 0
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
        barrier.wait(END, self._end_report())
        gevent.sleep(3600)  # the coordinator quits the run

    def _soak_turn(self) -> None:
        self._fresh_connections()
        if self.episode_turn == self.plan.turns:  # the episode is over: start afresh
            self._finish()
            self.environment.kvwatch_status.episode_ended(self.index)
            self.finished, self.episode_turn, self.candidates = False, 0, []
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
        report = {
            "conversations": self.conversations(),
            "context_tokens": self.context_tokens(),
            "replays": self.candidates[:1],
            **self._end_report(),
        }
        self.candidates = []
        return report

    def _end_report(self) -> dict:
        """This process's request counts so far: every request of this user's
        turn is done (the coordinator keeps each process's largest)."""
        process = str(getattr(self.environment.runner, "client_id", "local"))
        return {"process": process, "counts": self.environment.kvwatch_status.counts().to_json()}

    def keep_for_replay(self, data: dict | None, max_tokens: int) -> None:
        if data and "prompt_token_ids" in data:
            self.candidates.append(
                [data["prompt_token_ids"], data["choices"][0]["token_ids"], max_tokens]
            )

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


class AgentTrieUser(TurnUser):
    """agentic-trie: chats over a shared system prompt, parallel tool calls over a
    shared tool schema, and (for the first three agents) a sub-agent forked from
    where the agent's chat stood after its first turn."""

    def setup(self) -> None:
        self.chats = [Chat([self.system])]

    def turn(self, t: int) -> None:
        if t == 1 and self.index // 1000 < 3:
            self.chats.append(Chat(self.chats[0].messages))

        def step(chat: Chat) -> None:
            data = chat.step(self, sentence(self.rng), name="agent turn")
            if chat is self.chats[0]:
                self.keep_for_replay(data, 8)

        def tool_call(lo: int = 2, hi: int = 5) -> None:
            words = sentence(self.rng, lo, hi)
            self.chat(
                [self.system, self.schema, {"role": "user", "content": words}], name="tool call"
            )

        def tool_result() -> None:  # a long one: still in prefill while the others commit
            tool_call(60, 90)

        chats = [lambda c=c: step(c) for c in self.chats]
        # The hedge needs the server's test controls to mean anything (a black-box
        # target has none: there it would only be a duplicate request).
        hedged = [self.hedged_result] if self.plan.probe else []
        parallel(*chats, tool_call, tool_call, tool_result, *hedged)

    def hedged_result(self) -> None:
        """A long tool result sent twice, the hedge once the server has the first: a
        client hedging a slow request. Against kvwatch's engine the first is pushed
        out (scripted pool pressure) once it owns state past the shared prefix, and
        the hedge computes on through the node the first will recover from, the
        host-ref case of seed 000."""
        prompt = [self.system, self.schema, {"role": "user", "content": sentence(self.rng, 60, 90)}]
        controls = {"retract_after": RETRACT_AFTER, "hold_steps": HOLD_STEPS}
        hedges = []

        def hedge() -> None:
            hedges.append(gevent.spawn(self.chat, prompt, name="hedge"))

        self.stream_chat(
            prompt,
            name="hedged tool result",
            max_tokens=8,
            extra={"kvwatch": controls},
            on_start=hedge,
        )
        gevent.joinall(hedges)

    def conversations(self) -> int:
        return len(self.chats)

    def context_tokens(self) -> int:
        return sum(c.tokens for c in self.chats)


class SessionUser(TurnUser):
    """A user whose conversations are kvwatch streaming sessions (kept cache slots)."""

    abstract = True

    def setup(self) -> None:
        self.sessions: list[str] = []

    def open_session(self, **body) -> str | None:
        resp = self.client.post("/v1/sessions", json=body, name="/v1/sessions")
        if resp.status_code != 200:
            return None
        self.sessions.append(resp.json()["id"])
        return self.sessions[-1]

    def finish(self) -> None:
        for sid in self.sessions:
            self._close(sid)

    def _close(self, sid: str) -> None:
        """Close a session; while a turn of it that the client cut is still being
        aborted the server answers 409 session_busy, so ask again."""
        for attempt in range(CLOSE_TRIES):
            with self.client.delete(
                f"/v1/sessions/{sid}", name="/v1/sessions/[id]", catch_response=True
            ) as resp:
                busy = resp.status_code == 409 and "session_busy" in resp.text
                if not busy or attempt == CLOSE_TRIES - 1:
                    return  # Locust judges the answer (a 2xx passes)
                resp.success()  # not an error yet: try again
            gevent.sleep(0.1)

    def conversations(self) -> int:
        return len(self.sessions)

    def context_tokens(self) -> int:
        total = 0
        for sid in self.sessions:
            resp = self.client.get(f"/v1/sessions/{sid}", name="/v1/sessions/[id]")
            total += resp.json()["tokens"] if resp.status_code == 200 else 0
        return total


class StreamingSessionUser(SessionUser):
    """streaming-session: an agent with two kept session slots (planner and worker)
    streaming turns side by side with speculative decoding; the first turn of one
    is cut mid-stream."""

    def setup(self) -> None:
        super().setup()
        self.open_session()
        self.open_session()

    def turn(self, t: int) -> None:
        def session_turn(i: int, sid: str) -> None:
            first = [self.system] if t == 0 else []
            self.stream_chat(
                [*first, {"role": "user", "content": sentence(self.rng)}],
                name="session turn",
                session_id=sid,
                max_tokens=48 if t == 0 else 16,
                cut_after=self.rng.randint(2, 6) if t == 0 and i == 0 else None,
            )

        parallel(*(lambda i=i, s=s: session_turn(i, s) for i, s in enumerate(self.sessions)))


class RolloutUser(SessionUser):
    """rl-rollout: a recorded session with routed experts; n sampled rollouts per
    prompt, a rollback every third turn, and the trajectory fetched every turn."""

    samples = 2

    def setup(self) -> None:
        super().setup()
        self.session_id = self.open_session(record=True, routed_experts=True)

    def turn(self, t: int) -> None:
        if self.session_id is None:
            return
        first = [self.system] if t == 0 else []
        self.chat(
            [*first, {"role": "user", "content": sentence(self.rng)}],
            name="rollout turn",
            max_tokens=16,
            session_id=self.session_id,
        )
        if t % 3 == 2:  # the policy backs off a step and tries again
            self.client.post(
                f"/v1/sessions/{self.session_id}/rollback",
                json={"steps": 1},
                name="/v1/sessions/[id]/rollback",
            )
            self.chat(
                [{"role": "user", "content": sentence(self.rng)}],
                name="rollout turn",
                max_tokens=16,
                session_id=self.session_id,
            )
        prompt = [self.system, {"role": "user", "content": sentence(self.rng)}]
        seeds = [self.rng.randrange(2**31) for _ in range(self.samples)]
        parallel(
            *(lambda s=s: self.chat(prompt, name="sample", temperature=1.0, seed=s) for s in seeds)
        )
        self.client.get(
            f"/v1/sessions/{self.session_id}/trajectory", name="/v1/sessions/[id]/trajectory"
        )


class AbortStormUser(TurnUser):
    """abort-storm: a chat goes on while long prompts are cut mid-prefill, a stream
    is cut mid-decode, and a reader stalls."""

    def setup(self) -> None:
        self.chats = [Chat([self.system])]

    def turn(self, t: int) -> None:
        def cut_in_prefill() -> None:
            long = sentence(self.rng, 70, 110)
            wait = self.rng.uniform(0.03, 0.25)
            prompt = [self.system, self.schema, {"role": "user", "content": long}]
            self.chat(prompt, name="cut in prefill", max_tokens=16, timeout=wait)

        def cut_in_decode() -> None:
            prompt = [self.system, {"role": "user", "content": sentence(self.rng)}]
            self.stream_chat(
                prompt, name="cut in decode", max_tokens=32, cut_after=self.rng.randint(2, 8)
            )

        def stalled_reader() -> None:
            prompt = [self.system, {"role": "user", "content": sentence(self.rng)}]
            self.stream_chat(prompt, name="stalled reader", max_tokens=16, stall=0.3)

        def step() -> None:
            data = self.chats[0].step(self, sentence(self.rng), name="agent turn")
            self.keep_for_replay(data, 8)

        parallel(step, cut_in_prefill, cut_in_prefill, cut_in_decode, stalled_reader)

    def conversations(self) -> int:
        return 1

    def context_tokens(self) -> int:
        return self.chats[0].tokens


class SlotCacheUser(TurnUser):
    """slot-cache: seed 004's sequence on the snapshot-slot backend. Follow-ups
    shorten and lengthen; tiny chats have a boundary too short to snapshot."""

    def setup(self) -> None:
        self.chats = [Chat([self.system])]

    def turn(self, t: int) -> None:
        if self.rng.random() < 0.3:
            self.chat([{"role": "user", "content": sentence(self.rng, 1, 2)}], name="tiny chat")
            return
        lo, hi = (1, 3) if self.rng.random() < 0.5 else (12, 28)
        data = self.chats[0].step(self, sentence(self.rng, lo, hi), name="follow-up")
        self.keep_for_replay(data, 8)

    def conversations(self) -> int:
        return 1

    def context_tokens(self) -> int:
        return self.chats[0].tokens
