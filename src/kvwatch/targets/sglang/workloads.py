"""Seeded token-level workloads on SGLang's own scheduler: the gate's profiles for
``--engine sglang-cache`` (more in ``scheduler_workloads``).

The loop is SGLang's own scheduler (``loop.SchedulerLoop``), the workload the
shared one (``kvwatch.targets.driver.workload``). Each workload sizes the
pools (``config``); each ``turn`` submits one request (or a few) per
conversation, all at once so they share the scheduler's batches, steps the
scheduler until it is idle (its clients give up, aborting what is live,
when it stops admitting) and says how many conversations are
live and how many tokens they hold (``TurnStats``, what the recorder's
barrier wants); ``close`` ends the conversations (closes their sessions).
Tokens are random ints from one seeded ``Random``, so a (workload, c, seed)
is the same run on every release.

* ``agentic``: a shared system prompt; per agent and turn one request with
  its history, two parallel tool calls sharing a tool-schema prefix, and on
  odd turns a sub-agent forked from the agent's history (a radix trie);
* ``sessions``: one streaming session per conversation and a forced
  retraction every 3 decode steps (retract-and-retry re-matches the session
  slot): seed 001's load, without its speculative decoding (no draft
  model worker stands in here);
* ``aborts``: per turn, one conversation's request is aborted while queued
  (the prefill adder rejected it after matching its prefix), one between
  its prefill chunks, one while decoding, and one waits for memory past the
  waiting timeout (releases without one run it late); the rest finish;
* ``pressure``: multi-turn conversations on a pool too small for all of
  them, so the tree is evicted and running requests are retracted.

``cache="mamba"`` adds a mamba state pool (the release's cache for a hybrid
SSM model), ``cache="swa"`` a sliding-window sub-pool (a hybrid SWA model).

Invariant: a workload drives the scheduler only through ``submit``,
``abort``, ``open_session``, ``close_session`` and ``step``, as SGLang's
clients and event loop would.
"""

from __future__ import annotations

from typing import Any, ClassVar

from kvwatch.targets.driver import workload as shared
from kvwatch.targets.driver.workload import IdleRule, Schedule, TurnStats
from kvwatch.targets.sglang.loop_parts import LoopConfig, PoolConfig

MAX_STEPS = 20_000  # per turn: a scheduler that never gets idle breaks the run
BIG_MARGIN = 24  # aborts: a waiting prompt leaves this much of the pool for its output


class Workload(shared.Workload):
    """A profile of ``--engine sglang-cache``: the shared workload with the pools it
    sizes (``config``) for a cache kind and page size.

    It runs the loop to idle (``run``) through a ``Schedule`` of what the clients do
    at chosen steps, then one idle loop iteration (SGLang's loop keeps polling:
    deferred closes are reaped). When the scheduler stops admitting
    (``loop.stalled()``: its admission watch says so), the clients give up: they
    abort every request still live, once."""

    vocab: ClassVar[int] = 30_000
    idle_rule: ClassVar[IdleRule] = IdleRule(
        max_steps=MAX_STEPS,
        stuck="the scheduler did not get idle in {n} steps",
        give_up=True,
        idle_step=True,
    )

    def __init__(
        self,
        *,
        c: int = 4,
        seed: int = 0,
        page_size: int = 1,
        cache: str = "radix",
    ) -> None:
        super().__init__(c=c, seed=seed)
        self.page_size, self.cache = page_size, cache
        self.sliding_window = 16

    def pool_config(self, kv_tokens: int) -> PoolConfig:
        kv = -(-kv_tokens // self.page_size) * self.page_size
        swa = kv if self.cache == "swa" else None  # as many SWA slots as full ones
        return PoolConfig(
            kv_tokens=kv,
            page_size=self.page_size,
            req_slots=4 * self.c + 8,
            mamba_slots=8 * self.c + 16 if self.cache == "mamba" else None,
            swa_tokens=swa,
            sliding_window=self.sliding_window if swa else None,
        )

    def config(self) -> LoopConfig:
        raise NotImplementedError

    @staticmethod
    def reply(req: Any) -> list[int]:
        """What the request generated, as the next turn sees it."""
        n = req.finished_len if req.finished_len is not None else len(req.output_ids)
        return list(req.output_ids[: min(n, req.sampling_params.max_new_tokens)])


class Agentic(Workload):
    name = "agentic"
    summary = "agents on a shared system prompt with parallel tool calls and forked sub-agents"

    def config(self) -> LoopConfig:
        return LoopConfig(pools=self.pool_config(1024 * self.c), chunked_prefill_size=256)

    def start(self, loop: Any) -> None:
        self.system, self.schema = self.tokens(48), self.tokens(24)
        self.histories = {f"agent{i}": [] for i in range(self.c)}

    def turn(self, loop: Any, t: int) -> TurnStats:
        mains = {}
        for name, hist in self.histories.items():
            base = self.system + hist + self.tokens(12)
            mains[name] = (loop.submit(f"{name}-t{t}", base, 8), base)
            for k in range(2):  # parallel tool calls sharing the schema prefix
                loop.submit(f"{name}-t{t}-tool{k}", base + self.schema + self.tokens(6), 4)
            if t % 2 == 1:  # a sub-agent forked from the agent's history
                loop.submit(f"{name}-t{t}-sub", base + self.tokens(16), 6)
        self.run(loop)
        for name, (req, base) in mains.items():
            self.histories[name] = base[len(self.system) :] + self.reply(req)
        return self.stats()


NEW_TOKENS = (7, 8, 9)  # a session turn's new tokens, by session and turn (Sessions)


class Sessions(Workload):
    name = "sessions"
    sessions = True
    summary = "streaming sessions with a forced retraction every 3 decode steps"

    def config(self) -> LoopConfig:
        return LoopConfig(
            pools=self.pool_config(512 * self.c),
            streaming=True,
            retract_every=3,
        )

    def start(self, loop: Any) -> None:
        for i in range(self.c):
            self.open(loop, f"sess{i}")
            self.histories[f"sess{i}"] = []

    def turn(self, loop: Any, t: int) -> TurnStats:
        reqs = {}
        for i, sid in enumerate(self.histories):
            # 7, 8 or 9 new tokens: a session's lengths, and so the prefixes a retried
            # turn is matched at, take every residue mod a page, its first token too
            new = self.tokens(NEW_TOKENS[(i + t) % len(NEW_TOKENS)])
            reqs[sid] = (loop.submit(f"{sid}-t{t}", new, 6, session_id=sid), new)
        self.run(loop)
        for sid, (req, new) in reqs.items():
            self.histories[sid] += new + self.reply(req)
        return self.stats()

    def close(self, loop: Any) -> None:
        for sid in self.histories:
            loop.close_session(sid)
        self.histories = {}
        self.run(loop)  # the scheduler takes the closes at its next iterations


class Aborts(Workload):
    name = "aborts"
    summary = "requests aborted while queued, between prefill chunks and while decoding; timeouts"

    def config(self) -> LoopConfig:
        return LoopConfig(
            pools=self.pool_config(160 * self.c + 64),
            chunked_prefill_size=32,
            waiting_timeout_steps=4,
            max_running_requests=max(self.c, 4),
        )

    def start(self, loop: Any) -> None:
        self.histories = {f"conv{i}": self.tokens(40) for i in range(self.c)}

    def _plan(self, loop: Any, t: int, i: int, name: str, schedule: Schedule, later: list) -> Any:
        """One conversation's request this turn; the running one, if it is that."""
        hist, stage = self.histories[name], (i + t) % 4
        # fits the pool alone, not while anything else holds memory: the prefill adder
        # rejects it (NO_TOKEN) at every such step, after matching its prefix
        big = hist + self.tokens(loop.config.pools.kv_tokens - BIG_MARGIN - len(hist))
        if stage == 0:  # waits for memory, then its client gives up
            rid = f"{name}-t{t}-queued"
            later.append((rid, big))
            schedule.before_step(3, lambda: loop.abort(rid))
        elif stage == 1:  # waits until the waiting timeout (or, without one, runs late)
            later.append((f"{name}-t{t}-late", big))
        elif stage == 2:  # a long prompt, aborted between its prefill chunks
            rid = f"{name}-t{t}-chunked"
            later.insert(0, (rid, hist + self.tokens(96)))
            schedule.before_step(2, lambda: loop.abort(rid))
        else:
            rid = f"{name}-t{t}-run"
            req = loop.submit(rid, hist + self.tokens(10), 12)
            if t % 2 == 0:  # aborted while decoding
                schedule.before_step(6, lambda: loop.abort(rid))
            return req
        return None

    def turn(self, loop: Any, t: int) -> TurnStats:
        reqs, schedule, later = {}, Schedule(), []
        for i, name in enumerate(self.histories):
            req = self._plan(loop, t, i, name, schedule, later)
            if req is not None:
                reqs[name] = req
        for rid, prompt in later:
            loop.submit(rid, prompt, 8)
        self.run(loop, schedule)
        for name, req in reqs.items():
            if not isinstance(req.finished_reason, loop.sb.FINISH_ABORT):
                self.histories[name] = list(req.origin_input_ids) + self.reply(req)
        return self.stats()


class Pressure(Workload):
    name = "pressure"
    summary = "multi-turn conversations on a pool too small for them: eviction and retraction"

    def config(self) -> LoopConfig:
        pools = self.pool_config(56 * self.c + 64)
        return LoopConfig(pools=pools, max_running_requests=self.c)

    def start(self, loop: Any) -> None:
        self.histories = {f"conv{i}": self.tokens(24) for i in range(self.c)}

    def turn(self, loop: Any, t: int) -> TurnStats:
        reqs = {
            n: loop.submit(f"{n}-t{t}", h + self.tokens(6), 24) for n, h in self.histories.items()
        }
        self.run(loop)
        for name, req in reqs.items():  # keep contexts bounded: the pool is small on purpose
            self.histories[name] = (list(req.origin_input_ids) + self.reply(req))[-48:]
        return self.stats()


WORKLOADS: dict[str, type[Workload]] = {w.name: w for w in (Agentic, Sessions, Aborts, Pressure)}
