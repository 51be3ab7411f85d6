"""Profiles that need SGLang's own scheduler paths: priority, abort stages, session churn
and session pressure.

Seeded like ``workloads`` (a ``Workload`` each; token ids from one
``Random``; pools sized per profile):

* ``priority``: ``--enable-priority-scheduling`` with ``--max-queued-requests
  c`` and a waiting timeout of 12 iterations: per turn, c low-priority
  requests run (c is also the running limit), c more queue up, high-priority
  arrivals take the places of queued low-priority ones ("aborted by a higher
  priority request"), a further low-priority arrival finds the queue full,
  and a lowest-priority request waits behind the second wave past the
  timeout.
* ``abort-stages``: each conversation's request is aborted at one stage per
  turn, in turn: as it arrives (in the iteration that receives it), while
  queued for memory, between its prefill chunks, while decoding, and while
  retracted (a forced retraction every 2 decode steps puts requests back in
  the queue; the client aborts the first of its requests it finds there, the
  one place a client here reads the scheduler); a normal request per
  conversation finishes and grows its history.
* ``session-churn``: short-lived streaming sessions: each conversation opens
  a session per turn, sends two turns (the second after the first ended)
  and closes it.
* ``session-pressure``: one streaming session per conversation, open for the
  whole run, each turn of it growing the KV the session pins; then a plain
  request that would fit the pool but for what the sessions pin, which waits
  (nothing will free that KV) until its client gives up; then a short
  request, which an idle engine fits and must run.

Invariant: like ``workloads``, a workload drives the scheduler only
through ``submit``, ``abort``, ``open_session``, ``close_session`` and
``step``.
"""

from __future__ import annotations

from typing import Any

from kvwatch.targets.driver.workload import Schedule, TurnStats
from kvwatch.targets.sglang.loop_parts import LoopConfig
from kvwatch.targets.sglang.workloads import Workload

LOW, HIGH, LOWEST = 0, 10, -5


class Priority(Workload):
    name = "priority"
    summary = "priority scheduling with a queued-requests limit and a waiting timeout"

    def config(self) -> LoopConfig:
        return LoopConfig(
            pools=self.pool_config(192 * self.c + 128),
            max_running_requests=self.c,
            max_queued_requests=self.c,
            priority_scheduling=True,
            waiting_timeout_steps=12,
        )

    def start(self, loop: Any) -> None:
        self.system = self.tokens(32)
        self.histories = {f"conv{i}": self.tokens(16) for i in range(self.c)}

    def _send(self, loop: Any, rid: str, name: str, out: int, priority: int) -> Any:
        prompt = self.system + self.histories[name] + self.tokens(6)
        return loop.submit(rid, prompt, out, priority=priority)

    def turn(self, loop: Any, t: int) -> TurnStats:
        """Step 0: c requests run (the running limit); 1: c queue up (the queue
        limit); 3: higher-priority ones take queued places; 4: one more finds the
        queue full; 12: a lowest-priority one waits behind the second wave past
        the waiting timeout."""
        names = list(self.histories)
        bulk = {n: self._send(loop, f"{n}-t{t}-bulk", n, 10, LOW) for n in names}
        schedule = Schedule(at={1: [], 3: []})
        for n in names:
            schedule.at[1].append(lambda n=n: self._send(loop, f"{n}-t{t}-queued", n, 16, LOW))
        for n in names[: max(1, self.c // 2)]:
            schedule.at[3].append(lambda n=n: self._send(loop, f"{n}-t{t}-high", n, 16, HIGH))
        schedule.at[4] = [lambda: self._send(loop, f"{names[0]}-t{t}-full", names[0], 8, LOW)]
        schedule.at[12] = [lambda: self._send(loop, f"{names[0]}-t{t}-lowest", names[0], 8, LOWEST)]
        self.run(loop, schedule)
        for name, req in bulk.items():
            self.histories[name] = (self.histories[name] + self.reply(req))[-64:]
        return self.stats()


STAGES = ("arrival", "queued", "chunked", "decoding", "retracted")
MARGIN = 24  # a queued-stage prompt leaves this much of the pool for its output


class AbortStages(Workload):
    name = "abort-stages"
    summary = "a request aborted at each stage: arrival, queued, chunked, decoding, retracted"

    def config(self) -> LoopConfig:
        return LoopConfig(
            pools=self.pool_config(160 * self.c + 64),
            chunked_prefill_size=32,
            retract_every=2,
            max_running_requests=max(self.c, 4) + 2,
        )

    def start(self, loop: Any) -> None:
        self.histories = {f"conv{i}": self.tokens(24) for i in range(self.c)}

    def _aborted(self, loop: Any, t: int, i: int, name: str, schedule: Schedule) -> None:
        stage = STAGES[(i + t) % len(STAGES)]
        rid, hist = f"{name}-t{t}-{stage}", self.histories[name]
        if stage == "queued":  # fits the pool alone, not while others hold memory
            prompt = hist + self.tokens(loop.config.pools.kv_tokens - MARGIN - len(hist))
            return self._later(loop, rid, prompt, 8, schedule, at=3)
        prompt = hist + self.tokens(96 if stage == "chunked" else 10)
        loop.submit(rid, prompt, 24)
        if stage == "retracted":
            for k in range(3, 15):
                schedule.before_step(k, lambda rid=rid: self._if_retracted(loop, rid))
            at = 15
        else:
            at = {"arrival": 0, "chunked": 2, "decoding": 6}[stage]
        schedule.before_step(at, lambda: self._once(loop, rid))

    def _later(self, loop: Any, rid: str, prompt: list, out: int, schedule: Schedule, at: int):
        schedule.before_step(1, lambda: loop.submit(rid, prompt, out))
        schedule.before_step(at, lambda: self._once(loop, rid))

    def _once(self, loop: Any, rid: str) -> None:
        if rid not in self.asked:
            self.asked.add(rid)
            loop.abort(rid)

    def _if_retracted(self, loop: Any, rid: str) -> None:
        if any(r.rid == rid and r.is_retracted for r in loop.waiting_queue):
            self._once(loop, rid)

    def turn(self, loop: Any, t: int) -> TurnStats:
        schedule = Schedule()
        self.asked: set[str] = set()
        done = {}
        for i, name in enumerate(self.histories):
            self._aborted(loop, t, i, name, schedule)
            prompt = self.histories[name] + self.tokens(6)
            done[name] = (loop.submit(f"{name}-t{t}-ok", prompt, 8), prompt)
        self.run(loop, schedule)
        for name, (req, prompt) in done.items():
            self.histories[name] = (prompt + self.reply(req))[-96:]
        return self.stats()


class SessionChurn(Workload):
    name = "session-churn"
    sessions = True
    summary = "short-lived streaming sessions: opened, two turns, closed, every turn"

    def config(self) -> LoopConfig:
        return LoopConfig(pools=self.pool_config(256 * self.c), streaming=True)

    def start(self, loop: Any) -> None:
        self.histories = {f"conv{i}": [] for i in range(self.c)}
        self.system = self.tokens(24)

    def turn(self, loop: Any, t: int) -> TurnStats:
        sids = {name: f"{name}-s{t}" for name in self.histories}
        for sid in sids.values():
            self.open(loop, sid)
        for k in range(2):
            reqs = {}
            for name, sid in sids.items():
                new = (self.system if k == 0 else []) + self.tokens(8)
                reqs[name] = (loop.submit(f"{sid}-t{k}", new, 6, session_id=sid), new)
            self.run(loop)
            for name, (req, new) in reqs.items():
                self.histories[name] = (self.histories[name] + new + self.reply(req))[-64:]
        for sid in sids.values():
            loop.close_session(sid)
        self.run(loop)
        return self.stats()


class SessionPressure(Workload):
    name = "session-pressure"
    sessions = True
    summary = "sessions pin KV; a request too big for the rest is given up on; a short one must run"

    def config(self) -> LoopConfig:
        return LoopConfig(
            pools=self.pool_config(160 * self.c),
            streaming=True,
            chunked_prefill_size=64,
            max_prefill_tokens=128,
            max_running_requests=2 * self.c,
        )

    def start(self, loop: Any) -> None:
        for i in range(self.c):
            self.open(loop, f"sess{i}")
            self.histories[f"sess{i}"] = []

    def turn(self, loop: Any, t: int) -> TurnStats:
        """Each session's next turn; then a request that fits the pool only without
        what the sessions pin, left to wait until its client gives up; then a
        short request."""
        reqs = {}
        for sid in self.histories:
            new = self.tokens(16 if t == 0 else 8)
            reqs[sid] = (loop.submit(f"{sid}-t{t}", new, 8, session_id=sid), new)
        self.run(loop)
        for sid, (req, new) in reqs.items():
            self.histories[sid] += new + self.reply(req)
        loop.submit(f"big-t{t}", self.tokens(loop.config.pools.kv_tokens - 16), 8)
        self.run(loop)
        loop.submit(f"short-t{t}", self.tokens(4), 4)
        self.run(loop)
        return self.stats()

    def close(self, loop: Any) -> None:
        for sid in self.histories:
            loop.close_session(sid)
        self.histories = {}
        self.run(loop)


WORKLOADS: dict[str, type[Workload]] = {
    w.name: w for w in (Priority, AbortStages, SessionChurn, SessionPressure)
}
