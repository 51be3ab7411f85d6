"""The chaos profile's user: every session and request transition the other
profiles leave out, mixed from the run's seed.

One turn runs these side by side:

* the agent's main session: a streamed turn, cut mid-stream on some turns
  (running -> cut -> running), rolled back after others (parked -> rolled
  back -> running);
* a short-lived session that is opened and closed with no turn, closed right
  after a cut turn, or closed after a rollback (open, cut, rolled back ->
  closed), by turn;
* a long stateless request that the server's test controls push out to the
  host tier and then abort while it waits there, or while it recovers
  (retracted, recovering -> aborted), or pause mid-decode and then abort, or
  resume (decoding -> paused -> aborted | recovering): timings no client can
  hit on purpose;
* in the first turn, a session left idle: the server's idle timeout closes
  it (parked -> timed out), and the agent waits for that at the end.
"""

from __future__ import annotations

import time

from kvwatch.loadtests.agents import SessionUser
from kvwatch.loadtests.turns import parallel
from kvwatch.loadtests.users import sentence

IDLE_TIMEOUT_S = 5  # the chaos server's --session-idle-timeout (profiles.py)
CHECKS = 8  # looks at the abandoned session, one idle timeout apart, before giving up
# Pushed out 8 tokens into a ~300-token prompt: its recovery computes the rest
# over several steps, so "recovering" lasts past a step boundary. Paused once
# it has decoded 2 tokens: let go without a commit, then aborted there, or
# resumed to finish after recomputing what it gave up.
SCRIPTED = {
    "aborted while retracted": {"retract_after": 8, "hold_steps": 100_000, "abort_in": "retracted"},
    "aborted while recovering": {"retract_after": 8, "hold_steps": 2, "abort_in": "recovering"},
    "aborted while paused": {"pause_after_output": 2, "hold_steps": 100_000, "abort_in": "paused"},
    "paused and resumed": {"pause_after_output": 2, "hold_steps": 2},
}


class ChaosUser(SessionUser):
    def setup(self) -> None:
        super().setup()
        self.main = self.open_session()
        self.abandoned: str | None = None

    def turn(self, t: int) -> None:
        jobs = [lambda: self._main_turn(t), lambda: self._brief_session(t), self._scripted_abort]
        if t == 0:
            jobs.append(self._abandon_one)
        parallel(*jobs)

    def _main_turn(self, t: int) -> None:
        if self.main is not None and self._look(self.main) is None:
            self.sessions.remove(self.main)  # timed out while this client waited
            self.main = self.open_session()
        if self.main is None:
            return
        first = [self.system] if t == 0 else []
        cut = self.rng.randint(1, 3) if t % 3 == 1 else None
        self.stream_chat(
            [*first, {"role": "user", "content": sentence(self.rng)}],
            name="chaos session turn",
            session_id=self.main,
            max_tokens=16,
            cut_after=cut,
        )
        if t % 3 == 2:
            self._rollback(self.main)

    def _brief_session(self, t: int) -> None:
        sid = self.open_session()
        if sid is None:
            return
        if t % 3 == 1:  # a turn the client cuts, then the session closes at once
            self.stream_chat(
                [{"role": "user", "content": sentence(self.rng, 20, 30)}],
                name="brief session turn",
                session_id=sid,
                max_tokens=32,
                cut_after=1,
            )
        elif t % 3 == 2:  # a turn, rolled back, then closed
            self.chat(
                [{"role": "user", "content": sentence(self.rng)}],
                name="brief session turn",
                session_id=sid,
            )
            self._rollback(sid)
        self.sessions.remove(sid)
        self._close(sid)

    def _rollback(self, sid: str) -> None:
        self.client.post(
            f"/v1/sessions/{sid}/rollback", json={"steps": 1}, name="/v1/sessions/[id]/rollback"
        )

    def _scripted_abort(self) -> None:
        """A long request the server pushes out or pauses, then aborts or lets finish,
        as picked from the seed; an aborted one's client sees a stream that ends
        early, which is its answer."""
        name = self.rng.choice(sorted(SCRIPTED))
        prompt = [self.system, {"role": "user", "content": sentence(self.rng, 50, 60)}]
        self.stream_chat(prompt, name=name, max_tokens=8, extra={"kvwatch": SCRIPTED[name]})

    def _abandon_one(self) -> None:
        """A session with one turn that the client never uses again."""
        sid = self.open_session()
        if sid is None:
            return
        self.chat(
            [{"role": "user", "content": sentence(self.rng)}], name="abandoned turn", session_id=sid
        )
        self.sessions.remove(sid)
        self.abandoned = (sid, time.monotonic())

    def _look(self, sid: str) -> dict | None:
        """The session as the server has it, or None once the idle timeout closed it.

        A busy machine can keep this client away from its main session (at the
        turn barrier, say) for a whole timeout; the server closing it then is
        the behaviour under test, not a failure. A look is a use, so the
        session cannot time out between this look and the call that follows.
        """
        with self.client.get(
            f"/v1/sessions/{sid}", name="/v1/sessions/[id]", catch_response=True
        ) as resp:
            if resp.status_code == 409 and "session_closed" in resp.text:
                resp.success()
                return None
            return resp.json() if resp.status_code == 200 else None

    def context_tokens(self) -> int:
        return sum(state["tokens"] for sid in self.sessions if (state := self._look(sid)))

    def finish(self) -> None:
        for sid in self.sessions:
            if self._look(sid) is not None:
                self._close(sid)
        if self.abandoned is not None:
            self.await_idle_close(*self.abandoned, IDLE_TIMEOUT_S, CHECKS)
