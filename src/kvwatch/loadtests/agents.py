"""The profiles' users: each does one turn of its shape, then waits at the barrier
(the loop is ``TurnUser``'s, in ``turns.py``)."""

from __future__ import annotations

import time

import gevent

from kvwatch.loadtests.trajectory import Turn, trajectory_problem
from kvwatch.loadtests.turns import Chat, TurnUser, parallel
from kvwatch.loadtests.users import sentence

CLOSE_TRIES = 50  # x 0.1 s: a cut turn of a session may still be aborting
# the server aborts the turn itself at its first decoding step (test controls only)
SERVER_CUT = {"kvwatch": {"abort_in": "decoding"}}
# A hedged tool result is pushed out once it has computed two snapshot intervals
# (the engine's 64-token big pages) past its cached prefix, so it owns state, and
# held on the host tier long enough for its hedge to pass it.
RETRACT_AFTER, HOLD_STEPS = 128, 256


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
            chat.step(self, sentence(self.rng), name="agent turn")

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
        hedged = [self.hedged_result] if self.plan.test_controls else []
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
        self.opened.append(self.sessions[-1])
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

    def await_idle_close(self, sid: str, since: float, timeout_s: float, looks: int) -> bool:
        """Whether the server's idle timeout (``timeout_s``) closed session ``sid``,
        last used at ``since`` (monotonic), within ``looks`` looks (409 session_closed).

        A look is a use that restarts the session's idle clock, so each look
        waits a whole timeout (and a margin) after the use before it.
        """
        last = since
        for _ in range(looks):
            gevent.sleep(max(0.0, last + timeout_s + 2 - time.monotonic()))
            with self.client.get(
                f"/v1/sessions/{sid}", name="abandoned session", catch_response=True
            ) as resp:
                if resp.status_code == 409 and "session_closed" in resp.text:
                    resp.success()
                    return True
                if resp.status_code == 200:
                    resp.success()  # not closed yet: look again
            last = time.monotonic()
        return False

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
    is cut mid-stream by its client.

    Where that hang-up lands is up to the scheduler: at c = 1 it can reach the
    server while the periodic retraction holds the turn, and a turn aborted while
    retracted leaves no tail in its slot. So where the server takes test
    controls, the other slot's first turn is also aborted by the server at its
    first decoding step: every run resumes at least one session over the pages
    an aborted turn left behind (the ``[prefix_len, allocated_len)`` tail)."""

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
                extra=SERVER_CUT if t == 0 and i == 1 and self.plan.test_controls else None,
            )

        parallel(*(lambda i=i, s=s: session_turn(i, s) for i, s in enumerate(self.sessions)))


class RolloutUser(SessionUser):
    """rl-rollout: a recorded session with routed experts; n sampled rollouts per
    prompt, a rollback every third turn, and the trajectory fetched every turn."""

    samples = 2

    def setup(self) -> None:
        super().setup()
        self.session_id = self.open_session(record=True, routed_experts=True)
        # each kept turn's (output start, output ids); None once a call failed and
        # the session's record is no longer known
        self.kept: list[Turn] | None = []

    def turn(self, t: int) -> None:
        if self.session_id is None:
            return
        first = [self.system] if t == 0 else []
        self._rollout_turn([*first, {"role": "user", "content": sentence(self.rng)}])
        if t % 3 == 2:  # the policy backs off a step and tries again
            back = self.client.post(
                f"/v1/sessions/{self.session_id}/rollback",
                json={"steps": 1},
                name="/v1/sessions/[id]/rollback",
            )
            if self.kept is not None:
                self.kept = self.kept[:-1] if back.status_code == 200 and self.kept else None
            self._rollout_turn([{"role": "user", "content": sentence(self.rng)}])
        prompt = [self.system, {"role": "user", "content": sentence(self.rng)}]
        seeds = [self.rng.randrange(2**31) for _ in range(self.samples)]
        parallel(
            *(lambda s=s: self.chat(prompt, name="sample", temperature=1.0, seed=s) for s in seeds)
        )
        with self.client.get(
            f"/v1/sessions/{self.session_id}/trajectory",
            name="/v1/sessions/[id]/trajectory",
            catch_response=True,
        ) as resp:
            ok = resp.status_code == 200 and self.kept is not None
            if ok and (problem := trajectory_problem(resp.json(), self.kept)):
                resp.failure(problem)

    def _rollout_turn(self, messages: list[dict]) -> None:
        data = self.chat(messages, name="rollout turn", max_tokens=16, session_id=self.session_id)
        if data is None or self.kept is None:
            self.kept = None
            return
        self.kept.append((data["usage"]["prompt_tokens"], data["choices"][0]["token_ids"]))


# tokens a cut request asks for: seconds of decode left behind every hang-up
CUT_ANSWER = 1500


class AbortStormUser(TurnUser):
    """abort-storm: a chat goes on while long prompts are cut mid-prefill, a stream
    is cut mid-decode, a non-streamed answer is hung up on while it decodes, and a
    reader stalls.

    Every cut request asks for a long answer (``CUT_ANSWER`` tokens, ``ignore_eos``):
    one whose abort is lost anywhere (the handler, the SSE generator, the worker,
    the engine) runs on for far longer than the abandoned oracle's margin of 32
    steps and 3 s, on any machine; aborted, it costs nothing.
    """

    def setup(self) -> None:
        self.chats = [Chat([self.system])]

    def turn(self, t: int) -> None:
        def cut_in_prefill() -> None:
            long = sentence(self.rng, 70, 110)
            prompt = [self.system, self.schema, {"role": "user", "content": long}]
            self._hang_up(prompt, "cut in prefill", self.rng.uniform(0.03, 0.25))

        def cut_in_decode() -> None:
            prompt = [self.system, {"role": "user", "content": sentence(self.rng)}]
            self.stream_chat(
                prompt,
                name="cut in decode",
                max_tokens=CUT_ANSWER,
                cut_after=self.rng.randint(2, 8),
                extra={"ignore_eos": True},
            )

        def hung_up_in_decode() -> None:
            # a short prompt's prefill is over well within the wait; the answer is not
            prompt = [self.system, {"role": "user", "content": sentence(self.rng)}]
            self._hang_up(prompt, "hung up in decode", self.rng.uniform(0.6, 1.5))

        def stalled_reader() -> None:
            prompt = [self.system, {"role": "user", "content": sentence(self.rng)}]
            self.stream_chat(prompt, name="stalled reader", max_tokens=16, stall=0.3)

        def step() -> None:
            self.chats[0].step(self, sentence(self.rng), name="agent turn")

        parallel(
            step, cut_in_prefill, cut_in_prefill, cut_in_decode, hung_up_in_decode, stalled_reader
        )

    def _hang_up(self, prompt: list[dict], name: str, wait: float) -> None:
        """A non-streamed request whose client leaves after ``wait`` seconds."""
        extra = {"ignore_eos": True}
        self.chat(prompt, name=name, max_tokens=CUT_ANSWER, timeout=wait, extra=extra)

    def conversations(self) -> int:
        return 1

    def context_tokens(self) -> int:
        return self.chats[0].tokens


class SlotCacheUser(TurnUser):
    """slot-cache: seed 004's sequence on the snapshot-slot backend. Follow-ups
    shorten and lengthen; tiny chats have a boundary too short to snapshot; every
    other turn the client retries its follow-up, a prompt shorter than the
    snapshot that follow-up left."""

    def setup(self) -> None:
        self.chats = [Chat([self.system])]

    def turn(self, t: int) -> None:
        if self.rng.random() < 0.3:
            self.chat([{"role": "user", "content": sentence(self.rng, 1, 2)}], name="tiny chat")
            return
        lo, hi = (1, 3) if self.rng.random() < 0.5 else (12, 28)
        answered = self.chats[0].step(self, sentence(self.rng, lo, hi), name="follow-up")
        if t % 2 == 1 and answered is not None:  # a failpoint may have refused the follow-up
            self.chat(self.chats[0].messages[:-1], name="retried follow-up")

    def conversations(self) -> int:
        return 1

    def context_tokens(self) -> int:
        return self.chats[0].tokens
