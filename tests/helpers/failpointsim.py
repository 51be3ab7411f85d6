"""Drive the engine with failpoints on, and check every oracle as it goes.

A run mixes what reaches every allocation site: conversation tries (shared
system prompt, forks: branch points and prefix waits), streaming sessions
(resume, rollback, close), speculation, forced retractions (the host tier and
the load back), noise requests aborted or paused, judged ones paused once, on
roomy, tight or tiny pools. After every step the
probe is clean and no usage bound is exceeded; every request either finishes
with the cache-off output or fails with an error it carries; nothing hangs;
once everything is done and the cache is flushed every pool is back to empty.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from conversations import Trie, oracle, small_cache
from sessionsim import system_prompt, user_turn

from kvwatch.engine import Engine, EngineConfig, SamplingParams, SchedulerConfig, SpecConfig
from kvwatch.engine.config import FailpointConfig, PrefixCacheMode
from kvwatch.engine.events import FailpointFired
from kvwatch.engine.request import Status

PARAMS = SamplingParams(max_tokens=12)
# pool sizes in pages (full.kv, swa.kv, both state groups, their host tier):
# tight pools retract and evict; tiny ones keep a few requests and parked slots
# at the edge of what fits
POOLS = {
    "roomy": dict(full=512, swa=128, state=48, host=24),
    "tight": dict(full=64, swa=64, state=14, host=6),
    "tiny": dict(full=32, swa=24, state=6, host=2),
}
MAX_STEPS = 4000  # per turn: a drained turn takes a few hundred at most; more is a hang


@dataclass(frozen=True, kw_only=True)
class Workload:
    """One engine and what runs through it."""

    mode: PrefixCacheMode = PrefixCacheMode.RADIX
    failpoints: FailpointConfig | None = field(default_factory=FailpointConfig)
    seed: int = 0
    max_running: int = 6
    chunk: int = 64
    spec: bool = True
    pools: str = "roomy"  # a POOLS key
    retract_every: int = 0
    conversations: int = 3
    sessions: int = 2
    turns: int = 3
    noise: int = 1  # requests per turn aborted or paused at a random step
    params: SamplingParams = PARAMS  # every request's (a seeded sampler is exact too)

    def engine(self) -> Engine:
        sizes = POOLS[self.pools]
        cache = small_cache(**sizes, mode=self.mode, slot_min_tokens=8, failpoints=self.failpoints)
        sched = SchedulerConfig(
            max_running=self.max_running,
            chunk_size=self.chunk,
            max_batch_tokens=max(self.chunk, 8) * 3,
            spec=SpecConfig(num_drafts=3) if self.spec else None,
            retract_every=self.retract_every,
        )
        return Engine(EngineConfig(cache=cache, scheduler=sched))


@dataclass
class Outcome:
    """What a run saw: requests finished and failed, failpoint firings by site."""

    finished: int = 0
    failed: list[str] = field(default_factory=list)
    fired: Counter[str] = field(default_factory=Counter)
    steps: int = 0


class FailpointRun:
    """Runs a ``Workload`` turn by turn; every check raises ``AssertionError``."""

    def __init__(self, workload: Workload) -> None:
        self.w = workload
        self.engine = workload.engine()
        self.rng = random.Random(workload.seed)
        self.outcome = Outcome()
        self.engine.events.subscribe(FailpointFired, lambda e: self.outcome.fired.update([e.site]))
        forks = 1 if workload.conversations else 0  # a fork copies a conversation
        self.trie = Trie(seed=workload.seed, conversations=workload.conversations, forks=forks)
        system = system_prompt(self.rng, 40)
        self.sessions = {self.engine.open_session(): list(system) for _ in range(workload.sessions)}
        self.expected: dict[str, list[int]] = {}  # request id -> its prompt
        self.paused: set[str] = set()  # requests paused once already

    def run(self) -> Outcome:
        for turn in range(self.w.turns):
            self.turn(turn)
            self.between_turns()
        self.finish()
        return self.outcome

    # -- one turn ------------------------------------------------------------------------
    def turn(self, turn: int) -> None:
        engine = self.engine
        trie_ids = [self.add(p) for p in self.trie.next_prompts(turn)]
        session_ids = {sid: self.add_turn(sid) for sid in self.sessions}
        noise = [self.add(self.trie._words(self.rng.randint(20, 90))) for _ in range(self.w.noise)]
        judged = [*trie_ids, *session_ids.values()]
        for _ in range(MAX_STEPS):
            if not engine.has_unfinished() and not self.resume_paused([*judged, *noise]):
                break
            self.disturb(noise, judged)
            engine.step()
            self.outcome.steps += 1
            self.check_probe()
        assert not engine.has_unfinished(), f"turn {turn} did not drain: a hang"
        for i, rid in enumerate(trie_ids):
            self.trie.histories[i] = self.judge(rid)
        for sid, rid in session_ids.items():
            self.judge(rid)
            self.sessions[sid] = list(engine.session_tokens(sid))
        for rid in noise:
            self.judge(rid, exact=False)

    def add(self, prompt: list[int]) -> str:
        rid = self.engine.add_request(prompt, self.w.params)
        self.expected[rid] = list(prompt)
        return rid

    def add_turn(self, sid: str) -> str:
        prompt = self.sessions[sid] + user_turn(self.rng, self.rng.randint(6, 40))
        rid = self.engine.add_request(prompt, self.w.params, session_id=sid)
        self.expected[rid] = prompt
        return rid

    def disturb(self, noise: list[str], judged: list[str]) -> None:
        """Now and then abort or pause a noise request, pause one whose output is
        judged (it resumes to the same output), or resume a paused one. Each is
        paused once at most: a request paused over and over never finishes."""
        engine, rng = self.engine, self.rng
        for rid in noise + judged:
            info = engine.request_info(rid)
            if info.done or rng.random() > (0.2 if rid in noise else 0.02):
                continue
            if info.status is Status.PAUSED:
                engine.resume(rid)
            elif rid in noise and rng.random() < 0.5:
                engine.abort(rid)
            elif rid not in self.paused:
                self.paused.add(rid)
                engine.pause(rid)

    def resume_paused(self, rids: list[str]) -> bool:
        """Resume these requests where paused (a paused request alone leaves the
        engine idle); whether any was."""
        paused = [rid for rid in rids if self.engine.request_info(rid).status is Status.PAUSED]
        for rid in paused:
            self.engine.resume(rid)
        return bool(paused)

    def judge(self, rid: str, *, exact: bool = True) -> list[int]:
        """Take a request: finished with the cache-off output, or failed with its
        error, never an internal one: a shortage is handled (aborts only among
        the noise). Returns the conversation so far."""
        done = self.engine.take(rid)
        prompt = self.expected.pop(rid)
        assert done.finish_reason in ("stop", "length", "abort", "error"), done
        assert (done.finish_reason == "error") == (done.error is not None), done
        if done.error is not None:
            assert not done.error.startswith("internal error"), done.error
            self.outcome.failed.append(done.error)
            return prompt + oracle(prompt, self.w.params)
        assert done.finish_reason != "abort" or not exact, f"{rid} aborted unasked"
        if done.finish_reason != "abort":
            self.outcome.finished += 1
            want = oracle(prompt, self.w.params)
            assert done.token_ids == want, f"{rid}: output differs from cache-off"
        return prompt + done.token_ids

    def check_probe(self) -> None:
        report = self.engine.probe()
        assert report.clean, "\n".join(map(str, report.findings))
        assert report.root_refs.actual == report.root_refs.expected, report.root_refs
        exceeded = {g: b for g, b in report.bounds.items() if b.exceeded}
        assert not exceeded, exceeded

    # -- between turns and at the end ----------------------------------------------------
    def between_turns(self) -> None:
        """Roll a session back one turn now and then (its slot rewinds its window)."""
        for sid in self.sessions:
            if self.engine.session_info(sid).turns >= 2 and self.rng.random() < 0.5:
                self.engine.rollback_session(sid, 1)
                self.sessions[sid] = list(self.engine.session_tokens(sid))
        self.check_probe()

    def finish(self) -> None:
        """Close the sessions, flush: the audit is clean and every pool is empty."""
        engine = self.engine
        for sid in self.sessions:
            engine.close_session(sid)
        engine.flush_cache()
        self.check_probe()
        report = engine.probe()
        for name, group in report.groups.items():
            assert group.free == group.capacity, f"{name} did not return to empty: {group}"


def varied(seed: int) -> Workload:
    """A workload drawn from ``seed``: mode, pools, batching, chunking, speculation,
    sampling, retractions, sessions and noise, and the failpoint schedule."""
    rng = random.Random(seed)
    mode = rng.choice([PrefixCacheMode.RADIX, PrefixCacheMode.SLOTS])
    sampled = rng.random() < 0.3
    return Workload(
        mode=mode,
        failpoints=FailpointConfig(seed=seed, first=rng.randint(1, 3), every=rng.randint(2, 9)),
        seed=seed,
        max_running=rng.randint(1, 8),
        chunk=rng.choice([1, 5, 16, 64, 80]),
        spec=rng.random() < 0.6,
        pools=rng.choice(list(POOLS)),
        retract_every=rng.choice([0, 0, 4, 7]),
        conversations=rng.randint(1, 4),
        sessions=rng.randint(0, 3),
        turns=rng.randint(2, 4),
        noise=rng.randint(0, 2),
        params=SamplingParams(max_tokens=12, temperature=0.7, seed=seed) if sampled else PARAMS,
    )
