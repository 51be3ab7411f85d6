"""The edges profile's user: the combinations and page boundaries of
``instrumentation/combos.py``, each taken on purpose, every choice from the seed.

One turn runs these side by side (``u``: the user's number, 0 to c - 1):

* *boundaries*: a trunk (the shared prefix ``S``, two pages, then tokens of its
  own) finishes, then four greedy siblings of one length leave it at branch
  points b = 33 ... 64, whose offsets b mod 32 (and so mod 16) are
  ``4u + j + 4t`` mod 32: at c = 8 every turn takes every offset, the last
  token of a page and the first of the next included. Sibling lengths are 95,
  96 and 97 by turn (P - 1, 0, 1 mod 16; W - 1, 0, 1 mod 32). Prompts are token
  ids, so branch points are exact, and greedy, so the replay compares them;
* *shallow*: a short trunk (17 to 31 tokens), then a sibling that shares only
  its first page: it resumes from a snapshot shallower than the sliding window
  (16 < W = 32), whose window is mostly padding;
* *one path*: three long prompts on ``S``'s path at once, two pushed out by the
  server's test controls and held (one longer), one left to prefill: a
  retraction while another prefills, waits or is retracted, a recovery while
  the other is still out. Under the profile's small pool, eviction on that
  path comes with them. Beside them a *cold* prompt that shares no page with
  anything, pushed out the same way, whose load back from the host tier fails
  (``fail_load``, as a full device pool fails it): nothing above its own
  snapshot is usable, so it recovers from nothing, as a cold request must;
* *a cut turn*: a session's second turn aborted by a test control at stage
  ``(u + t) mod 7`` (queued, prefilling, decoding, verifying, retracted,
  paused, recovering), then rolled back and closed, or closed;
* turn 1, *abandoned sessions*: one after a finished turn, one after a cut
  turn, and one whose close was refused while its turn ran (409
  ``session_busy``): the idle timeout closes each;
* turn 2, *a held turn*: a session's turn paused for longer than the idle
  timeout (``hold_s``), then decoding long: meanwhile the client sends a turn
  (409 ``session_busy``) and tries to close, to flush the cache (409
  ``engine_busy``, white-box) and to roll back every 0.1 s
  (refused while queued and while running) and the idle timeout tries too; once
  the turn ends the retried close goes through, and a turn on the closed session
  is refused (409 ``session_closed``);
* at the end, *left on the host*: a cold prompt pushed out and aborted on the
  host tier, its snapshot left there as cache for the drain's flush.
"""

from __future__ import annotations

import random
import time

import gevent

from kvwatch.loadtests.agents import SessionUser
from kvwatch.loadtests.turns import parallel
from kvwatch.loadtests.users import mark_failed, sentence

IDLE_TIMEOUT_S = 4  # the edges server's --session-idle-timeout (profiles.py)
SHARED = 32  # tokens of the shared prefix S: two pages, so every prompt here is on its path
OWN = range(32, 128)  # token ids of a trunk's own part
APART = range(128, 224)  # token ids of a sibling's part: never a trunk's, so it parts exactly
TRUNK = 112
SIBLINGS = 4
FIRST_BRANCH = 33  # b in 33 .. 64: b mod 32 takes every value, b > SHARED
SHALLOW = 16  # the shallow sibling's branch point: one page, below the window
LENGTHS = (95, 96, 97)
STAGES = ("queued", "prefilling", "decoding", "verifying", "retracted", "paused", "recovering")
CUT = {
    "queued": {"abort_in": "queued"},
    "prefilling": {"abort_in": "prefilling"},
    "decoding": {"abort_in": "decoding"},
    "verifying": {"abort_in": "verifying"},
    "retracted": {"retract_after": 8, "hold_steps": 100_000, "abort_in": "retracted"},
    "paused": {"pause_after_output": 2, "hold_steps": 100_000, "abort_in": "paused"},
    "recovering": {"retract_after": 8, "hold_steps": 2, "abort_in": "recovering"},
}
# one path: pushed out after their first chunk and held on the host tier, the
# second longer, so the first recovers while the second is still out
OUT_SHORT = {"retract_after": 16, "hold_steps": 8}
OUT_LONG = {"retract_after": 16, "hold_steps": 24}
# and a cold one, back first, whose snapshot cannot be loaded
OUT_COLD = {"retract_after": 16, "hold_steps": 4, "fail_load": True}
# a user's last request: pushed out the same way and aborted on the host tier
LEFT_ON_HOST = {"retract_after": 16, "hold_steps": 100_000, "abort_in": "retracted"}
HELD = {"pause_after_output": 2, "hold_s": IDLE_TIMEOUT_S + 2}
PESTER_S = 0.1
PESTER_FOR_S = 120.0
ABANDON_TURN, HOLD_TURN = 1, 2
LOOKS = 6  # at an abandoned session, one idle timeout apart, before giving up


class EdgeUser(SessionUser):
    def setup(self) -> None:
        super().setup()
        shared = random.Random(f"{self.plan.seed}:edges")
        self.prefix = [shared.choice(OWN) for _ in range(SHARED)]
        self.u = self.index // 1000 + self.index % 1000
        self.abandoned: list[tuple[str, float]] = []  # (session, its last use)
        self.trunk_tokens = 0

    def turn(self, t: int) -> None:
        jobs = [lambda: self._boundaries(t), lambda: self._shallow(t), self._one_path]
        jobs.append(lambda: self._cut_turn(t))
        if t == ABANDON_TURN:
            jobs += [self._abandon_finished, self._abandon_cut, self._abandon_refused]
        if t == HOLD_TURN:
            jobs.append(self._held_turn)
        parallel(*jobs)

    # -- token-id completions -------------------------------------------------------------
    def complete(self, tokens: list[int], *, name: str, max_tokens: int = 2, **extra) -> dict:
        """A greedy completion of token ids (comparable: the replay checks it)."""
        body = {"model": self.model, "prompt": tokens, "max_tokens": max_tokens}
        body |= {"temperature": 0.0, "return_token_ids": True, **extra}
        with self.client.post("/v1/completions", json=body, name=name, catch_response=True) as r:
            if r.status_code != 200:
                mark_failed(r)
                return {}
            return r.json()

    def _own(self, n: int, tokens: range = OWN) -> list[int]:
        return [self.rng.choice(tokens) for _ in range(n)]

    def _boundaries(self, t: int) -> None:
        trunk = self.prefix + self._own(TRUNK - SHARED)
        self.complete(trunk, name="trunk")
        self.trunk_tokens = len(trunk)
        length = LENGTHS[t % len(LENGTHS)]

        def sibling(j: int) -> None:
            b = FIRST_BRANCH + (4 * self.u + j + 4 * t - 1) % 32  # b mod 32 = 4u + j + 4t
            self.complete(trunk[:b] + self._own(length - b, APART), name="sibling")

        parallel(*(lambda j=j: sibling(j) for j in range(SIBLINGS)))

    def _shallow(self, t: int) -> None:
        trunk = self._own(SHALLOW + 1 + (self.u + t) % 15, APART)
        self.complete(trunk, name="shallow trunk", max_tokens=4)
        self.complete(trunk[:SHALLOW] + self._own(24, APART), name="shallow sibling")

    def _one_path(self) -> None:
        def long(name: str, controls: dict | None, tokens: list[int]) -> None:
            extra = {"kvwatch": controls} if controls else {}
            self.complete(tokens, name=name, max_tokens=4, **extra)

        on_path = [self.prefix + self._own(200) for _ in range(3)]
        parallel(
            lambda: long("pushed out", OUT_SHORT, on_path[0]),
            lambda: long("pushed out longer", OUT_LONG, on_path[1]),
            lambda: long("same path", None, on_path[2]),
            lambda: long("cold, its load failed", OUT_COLD, self._own(200, APART)),
        )

    # -- sessions -------------------------------------------------------------------------
    def _first_turn(self, sid: str, name: str) -> None:
        prompt = [self.system, {"role": "user", "content": sentence(self.rng)}]
        self.stream_chat(prompt, name=name, session_id=sid, max_tokens=4)

    def _long_message(self) -> list[dict]:
        return [{"role": "user", "content": sentence(self.rng, 24, 30)}]

    def _cut_turn(self, t: int) -> None:
        """A session turn aborted at stage (u + t) mod 7, then rolled back and closed
        (even u + t) or closed (odd)."""
        sid = self.open_session()
        if sid is None:
            return
        self._first_turn(sid, "first turn")
        stage = STAGES[(self.u + t) % len(STAGES)]
        controls = {"kvwatch": CUT[stage]}
        self.stream_chat(
            self._long_message(), name=f"cut {stage}", session_id=sid, max_tokens=8, extra=controls
        )
        if (self.u + t) % 2 == 0:
            self._rollback(sid)
        self.sessions.remove(sid)
        self._close(sid)

    def _rollback(self, sid: str) -> None:
        self.client.post(
            f"/v1/sessions/{sid}/rollback", json={"steps": 1}, name="/v1/sessions/[id]/rollback"
        )

    def _abandon(self, sid: str) -> None:
        self.sessions.remove(sid)
        self.abandoned.append((sid, time.monotonic()))

    def _abandon_finished(self) -> None:
        if (sid := self.open_session()) is not None:
            self._first_turn(sid, "abandoned turn")
            self._abandon(sid)

    def _abandon_cut(self) -> None:
        if (sid := self.open_session()) is not None:
            self._first_turn(sid, "abandoned turn")
            extra = {"kvwatch": CUT["decoding"]}
            self.stream_chat(
                self._long_message(), name="abandoned cut", session_id=sid, extra=extra
            )
            self._abandon(sid)

    def _abandon_refused(self) -> None:
        """A turn held paused for a second, a close refused meanwhile, then nothing."""
        sid = self.open_session()
        if sid is None:
            return
        extra = {"kvwatch": {"pause_after_output": 2, "hold_s": 1.0}}
        self.stream_chat(
            [self.system, *self._long_message()],
            name="abandoned held turn",
            session_id=sid,
            max_tokens=4,
            extra=extra,
            on_start=lambda: self._try_close(sid, "refused close"),
        )
        self._abandon(sid)

    def _held_turn(self) -> None:
        """A finished turn, rolled back; then a turn held past the idle timeout and
        decoding long, while the client asks every 0.1 s to roll back and to close."""
        sid = self.open_session()
        if sid is None:
            return
        self._first_turn(sid, "first turn")
        self._rollback(sid)
        pester: list[gevent.Greenlet] = []
        seeded = {"temperature": 1.0, "seed": self.rng.randrange(2**31), "ignore_eos": True}
        self.stream_chat(
            [self.system, *self._long_message()],
            name="held turn",
            session_id=sid,
            max_tokens=160,
            extra={"kvwatch": HELD, **seeded},
            on_start=lambda: pester.append(gevent.spawn(self._pester, sid)),
        )
        gevent.joinall(pester)
        self.sessions.remove(sid)

    def _pester(self, sid: str) -> None:
        """A turn while the held one runs (409 ``session_busy``); then close, flush the
        cache (409 ``engine_busy``) and roll back while the close is refused, until the
        close goes through; then a turn on the closed session (409 ``session_closed``)."""
        self._refused_turn(sid, "turn while busy", "session_busy")
        deadline = time.monotonic() + PESTER_FOR_S
        while time.monotonic() < deadline:
            if self._try_close(sid, "/v1/sessions/[id]") or self._flush_while_busy(sid):
                self._refused_turn(sid, "turn on a closed session", "session_closed")
                return
            with self.client.post(
                f"/v1/sessions/{sid}/rollback",
                json={"steps": 1},
                name="refused rollback",
                catch_response=True,
            ) as resp:
                _busy_is_fine(resp)
            gevent.sleep(PESTER_S)
        self._close(sid)  # Locust judges what it answers now

    def _refused_turn(self, sid: str, name: str, code: str) -> None:
        """A turn of session ``sid`` that the server must refuse with 409 ``code``. A
        busy session's turn is sent while the held turn is paused for seconds; should
        that turn have ended all the same, a 200 is its answer, not a failure."""
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": sentence(self.rng)}],
            "max_tokens": 2,
            "temperature": 0,
            "session_id": sid,
        }
        with self.client.post(
            "/v1/chat/completions", json=body, name=name, catch_response=True
        ) as resp:
            refused = resp.status_code == 409 and code in resp.text
            ended = code == "session_busy" and resp.status_code == 200
            if refused or ended:
                resp.success()
            else:
                mark_failed(resp)

    def _flush_while_busy(self, sid: str) -> bool:
        """A cache flush while session ``sid``'s held turn runs, which the server must
        refuse with 409 ``engine_busy``: a flush takes back what nobody references,
        and only an idle engine can say that of every page. True once the session is
        closed. A flush that went through is judged by the close sent right after it:
        the turn cannot end and start again, so a close still refused proves the turn
        ran while the flush went through (a bug), and a close that goes through says
        the turn had ended (no bug; the session is then closed). Sent where the plan's
        probe endpoints are this server's own (white-box)."""
        source = self.plan.source
        if not source.white_box or source.url is not None:
            return False
        headers = {"Authorization": f"Bearer {source.token}"} if source.token else {}
        with self.client.post(
            "/debug/flush_cache", headers=headers, name="flush while busy", catch_response=True
        ) as resp:
            if resp.status_code == 409 and "engine_busy" in resp.text:
                resp.success()
                return False
            if resp.status_code != 200:
                mark_failed(resp)
                return False
            closed = self._try_close(sid, "close after a flush")
            if closed:
                resp.success()
            else:
                resp.failure("the cache flush went through while a session's turn ran")
            return closed

    def _try_close(self, sid: str, name: str) -> bool:
        """One close: True once it went through; a refusal (a turn in flight) is fine."""
        with self.client.delete(f"/v1/sessions/{sid}", name=name, catch_response=True) as resp:
            _busy_is_fine(resp)
            return resp.status_code == 200

    # -- the end --------------------------------------------------------------------------
    def finish(self) -> None:
        self._leave_on_host()
        super().finish()
        for sid, since in self.abandoned:
            self.await_idle_close(sid, since, IDLE_TIMEOUT_S, LOOKS)

    def _leave_on_host(self) -> None:
        """A cold prompt pushed out to the host tier and aborted there, the last
        request of this user's run: its snapshot stays on the host as cache, and
        with at most one such request per user after the host tier last filled,
        the drain's flush finds it there (``host -> flushed``), whatever the timing."""
        prompt = self._own(200, APART)
        self.complete(prompt, name="left on the host", max_tokens=4, kvwatch=LEFT_ON_HOST)

    def conversations(self) -> int:
        return 1

    def context_tokens(self) -> int:
        return self.trunk_tokens


def _busy_is_fine(resp) -> None:
    if resp.status_code == 409 and "session_busy" in resp.text:
        resp.success()
