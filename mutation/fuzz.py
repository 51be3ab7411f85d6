"""The engine program: a seeded random run of the engine, judged by oracles
that know nothing about any particular bug.

A program adds requests that share prefixes (greedy, and sampled with a
seed), runs session turns, closes and rolls back sessions, steps, aborts,
pauses, resumes and retracts, on a few engine setups (radix with drafts
under pool pressure, roomy radix, the snapshot-slot backend). It observes:

* after every operation, the audit (ownership, refs, tree invariants) and the
  root's refs against the live holders;
* at the end, once the engine drained, every session closed and the cache
  flushed: every pool empty on device and host, and every registry the
  engine and its span listener hold back at its size when built (quiescence);
* every request that finished (stop or length) equal, token for token, to
  the same prompt on a cache-off engine (equivalence);
* no request failed (but for one a failpoint failed, in the setups that have
  them), and the engine drained.

The same seed gives the same program, so a mutant is judged on exactly the
operations the clean engine passes.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import replace
from typing import NamedTuple

from opentelemetry.sdk.trace import TracerProvider

from kvwatch.engine import (
    CacheConfig,
    Engine,
    EngineConfig,
    SamplingParams,
    SchedulerConfig,
    SpecConfig,
)
from kvwatch.engine.config import FailpointConfig, PrefixCacheMode
from kvwatch.engine.model.tokenizer import USER
from kvwatch.engine.request import Status
from kvwatch.harness.run_record import Candidate
from kvwatch.instrumentation.registries import registry_sizes
from kvwatch.instrumentation.spans import RequestSpans
from kvwatch.targets.kvwatch.replay import Reference

ALPHABET = [*range(32, 41), USER]  # few tokens, so prompts share pages; turn markers for slots
DRAIN_STEPS = 5000
LIVE = (Status.WAITING, Status.RUNNING, Status.RETRACTED, Status.PAUSED)


SETUPS: dict[str, EngineConfig] = {
    "radix-pressure": EngineConfig(
        cache=CacheConfig.sized(full=48, swa=40, state=12, host=6),
        scheduler=SchedulerConfig(
            max_running=4, chunk_size=16, max_batch_tokens=48, spec=SpecConfig(num_drafts=3)
        ),
    ),
    "radix-roomy": EngineConfig(
        cache=CacheConfig.sized(full=512, swa=128, state=48, host=24),
        scheduler=SchedulerConfig(max_running=8, chunk_size=40, max_batch_tokens=120),
    ),
    "slots": EngineConfig(
        cache=CacheConfig.sized(
            full=96, swa=48, state=14, host=6, mode=PrefixCacheMode.SLOTS, slot_min_tokens=8
        ),
        scheduler=SchedulerConfig(max_running=4, chunk_size=24, max_batch_tokens=72),
    ),
}


# Setups the programs above do not run, for lines they never reach (``reach.py``):
# every allocation failing on a schedule (failpoints), and the settings of the
# gate's configuration sweep (shared-prefix waits off, another page size,
# speculation off).
_PRESSURE = SETUPS["radix-pressure"]
_FAILPOINTS = FailpointConfig(first=2, every=5)
DIRECTED_SETUPS: dict[str, EngineConfig] = {
    "radix-pressure-failpoints": replace(
        _PRESSURE, cache=replace(_PRESSURE.cache, failpoints=_FAILPOINTS)
    ),
    "slots-failpoints": replace(
        SETUPS["slots"], cache=replace(SETUPS["slots"].cache, failpoints=_FAILPOINTS)
    ),
    "radix-pressure-no-waits": replace(
        _PRESSURE, scheduler=replace(_PRESSURE.scheduler, prefix_waits=False)
    ),
    "radix-pressure-page-8": replace(
        _PRESSURE,
        cache=replace(
            _PRESSURE.cache,
            full_kv=replace(_PRESSURE.cache.full_kv, page_size=8, capacity=96),
            swa_kv=replace(_PRESSURE.cache.swa_kv, page_size=8, capacity=80),
        ),
    ),
    "radix-pressure-no-spec": replace(_PRESSURE, scheduler=replace(_PRESSURE.scheduler, spec=None)),
}


def setup_of(name: str) -> EngineConfig:
    """A program's engine config, from SETUPS or DIRECTED_SETUPS."""
    return SETUPS[name] if name in SETUPS else DIRECTED_SETUPS[name]


class Program(NamedTuple):
    setup: str  # a SETUPS or DIRECTED_SETUPS key
    seed: int
    operations: int = 90

    @property
    def name(self) -> str:
        return f"{self.setup}/{self.seed}"


PROGRAMS = tuple(Program(setup, seed) for seed in (0, 1) for setup in SETUPS)
# What a mutant no program saw runs next, where it reaches the mutant's line.
DIRECTED = tuple(
    Program(setup, seed) for setup in [*SETUPS, *DIRECTED_SETUPS] for seed in (2, 3, 4)
)


class Observation(NamedTuple):
    """Something a program saw that a correct engine never shows."""

    program: Program
    oracle: str  # audit, quiescence, equivalence, failure, drain
    detail: str

    def __str__(self) -> str:
        return f"{self.program.setup}/seed {self.program.seed}: {self.oracle}: {self.detail}"


def run(program: Program) -> list[Observation]:
    """Run one program; what its oracles saw (nothing on a correct engine)."""
    return _Run(program).run()


class _Run:
    def __init__(self, program: Program) -> None:
        self.program = program
        self.rng = random.Random(program.seed)
        self.engine = Engine(setup_of(program.setup))
        # the span listener rides along: its per-request maps must drain too
        self.spans = RequestSpans(TracerProvider().get_tracer(__name__), self.engine.events)
        self.baseline = registry_sizes({"engine": self.engine})
        self.prompts: list[list[int]] = [[]]
        self.done: list[Candidate] = []
        self.doomed: set[str] = set()  # prompts longer than the device pools hold
        self.doomed_sessions: set[str] = set()  # too long for another turn

    # -- operations -------------------------------------------------------------
    def _ids(self, *statuses: Status) -> list[str]:
        return sorted(self.engine.request_ids(*statuses))

    def _idle_sessions(self) -> list[str]:
        """Open sessions with no turn in flight that can take another turn."""
        sessions = self.engine.open_sessions().items()
        return sorted(
            s for s, x in sessions if x.in_flight is None and s not in self.doomed_sessions
        )

    def _more(self, most: int) -> list[int]:
        return self._tokens(self.rng.randint(1, most))

    def _tokens(self, n: int) -> list[int]:
        return [self.rng.choice(ALPHABET) for _ in range(n)]

    def add(self) -> None:
        base = self.rng.choice(self.prompts[-5:])
        prompt = base[: self.rng.randint(0, len(base))] + self._more(60)
        self.prompts.append(prompt)
        sampled = self.rng.random() < 0.3
        params = SamplingParams(
            max_tokens=self.rng.randint(1, 10), temperature=0.8 if sampled else 0.0, seed=1
        )
        self.engine.add_request(prompt, params)

    def session_turn(self) -> None:
        idle = self._idle_sessions()
        if len(self.engine.open_sessions()) < 3 and (not idle or self.rng.random() < 0.3):
            record = self.rng.random() < 0.5
            self.engine.open_session(record=record, routed_experts=record)
            return
        if idle:
            sid = self.rng.choice(idle)
            tokens = self.engine.session_tokens(sid)
            params = SamplingParams(max_tokens=self.rng.randint(1, 8))
            self.engine.add_request([*tokens, *self._more(30)], params, session_id=sid)

    def _room(self) -> int:
        """Tokens full.kv holds."""
        cache = setup_of(self.program.setup).cache
        return cache.full_kv.capacity * cache.page_size

    def oversize(self) -> None:
        """A prompt longer than full.kv holds: it must fail with an error, and only it.

        As a session's turn, the session takes no other turn (its tokens stay
        in the session, so its next turn could not fit either) and its slot
        stays parked until the end: pressure has to make it let go.
        """
        length = self._room() + self.rng.randint(1, 64)
        if length >= setup_of(self.program.setup).model.max_model_len:
            return
        params = SamplingParams(max_tokens=self.rng.randint(1, 4))
        if not self._idle_sessions() or self.rng.random() < 0.5:
            self.doomed.add(self.engine.add_request(self._tokens(length), params))
            return
        sid = self.rng.choice(self._idle_sessions())
        tokens = self.engine.session_tokens(sid)
        more = self._tokens(max(1, length - len(tokens)))
        self.doomed.add(self.engine.add_request([*tokens, *more], params, session_id=sid))
        self.doomed_sessions.add(sid)

    def _drain(self) -> None:
        """Step until every request ended (paused ones resume first)."""
        for rid in self._ids(Status.PAUSED):
            self.engine.resume(rid)
        for _ in range(DRAIN_STEPS):
            if not self.engine.has_unfinished():
                break
            self.engine.step()

    def close_or_roll_back(self) -> None:
        idle = self._idle_sessions()
        if not idle:
            return
        sid = self.rng.choice(idle)
        if self.rng.random() < 0.4:
            self.engine.close_session(sid)
        elif self.engine.session_info(sid).turns >= 1:
            self.engine.rollback_session(sid, 1)

    def step(self) -> None:
        for _ in range(self.rng.randint(1, 4)):
            self.engine.step()

    def abort(self) -> None:
        if live := self._ids(*LIVE):
            self.engine.abort(self.rng.choice(live))

    def pause_or_resume(self) -> None:
        if live := self._ids(*LIVE):
            rid = self.rng.choice(live)
            paused = self.engine.request_info(rid).status is Status.PAUSED
            (self.engine.resume if paused else self.engine.pause)(rid)

    def retract(self) -> None:
        running = self._ids(Status.RUNNING)
        if len(running) > 1:
            self.engine.retract(self.rng.choice(running))

    OPERATIONS = (
        (add, 6),
        (session_turn, 3),
        (oversize, 1),
        (close_or_roll_back, 1),
        (step, 7),
        (abort, 1),
        (pause_or_resume, 1),
        (retract, 1),
    )

    # -- oracles ------------------------------------------------------------------
    def audit(self, after: str) -> Iterator[Observation]:
        report = self.engine.probe()
        for finding in report.findings:
            yield Observation(self.program, "audit", f"after {after}: {finding}")
        for bound in report.bounds.values():
            if bound.exceeded:
                detail = f"after {after}: {bound.group} pins {bound.pinned} pages, live holders justify {bound.limit}"
                yield Observation(self.program, "bound", detail)
        if report.root_refs.actual != report.root_refs.expected:
            detail = f"after {after}: root refs {report.root_refs.actual}, expected {report.root_refs.expected}"
            yield Observation(self.program, "audit", detail)

    def collect(self) -> Iterator[Observation]:
        for rid in self._ids(Status.FINISHED, Status.ABORTED, Status.FAILED):
            p = self.engine.request_info(rid).params
            done = self.engine.take(rid)
            if rid in self.doomed:
                if done.error is None and done.finish_reason != "abort":
                    detail = (
                        f"{rid}: a prompt longer than the pools hold ended {done.finish_reason!r}"
                    )
                    yield Observation(self.program, "failure", detail)
            elif done.error is not None and "(failpoint " not in done.error:
                # a failpoint may fail a request that cannot go on even alone
                yield Observation(self.program, "failure", f"{rid}: {done.error}")
            elif done.finish_reason in ("stop", "length"):
                prompt, output = tuple(done.prompt_token_ids), tuple(done.token_ids)
                self.done.append(
                    Candidate(
                        turn=0,
                        prompt=prompt,
                        output=output,
                        max_tokens=p.max_tokens,
                        temperature=p.temperature,
                        top_p=p.top_p,
                        seed=p.seed,
                    )
                )

    def run(self) -> list[Observation]:
        """The program, then drain, close, flush and the end-state oracles."""
        ops, weights = zip(*self.OPERATIONS, strict=True)
        for _ in range(self.program.operations):
            op = self.rng.choices(ops, weights)[0]
            op(self)
            if seen := list(self.audit(op.__name__)):
                return seen
        return list(self.finish())

    def finish(self) -> Iterator[Observation]:
        engine = self.engine
        self._drain()
        if engine.has_unfinished():
            yield Observation(self.program, "drain", f"still running after {DRAIN_STEPS} steps")
            return
        yield from self.collect()
        for sid in engine.open_sessions():
            engine.close_session(sid)
        engine.flush_cache()
        yield from self.audit("the flush")
        report = engine.probe()
        for name, group in report.groups.items():
            host = group.by_owner.get("host", 0)
            if group.free != group.capacity or host:
                detail = f"{name}: {group.used} device and {host} host pages held after the flush"
                yield Observation(self.program, "quiescence", detail)
        after = registry_sizes({"engine": engine})
        for path, size in sorted(after.items()):
            if size != self.baseline.get(path, 0):
                detail = f"{path} holds {size} entries, {self.baseline.get(path, 0)} when built"
                yield Observation(self.program, "quiescence", detail)
        yield from self.equivalence()

    def equivalence(self) -> Iterator[Observation]:
        replays = Reference(setup_of(self.program.setup)).replay(self.done)
        for r in replays:
            if r.cached != r.reference:
                detail = f"{len(r.prompt)}-token prompt: {list(r.cached)} != cache-off {list(r.reference)}"
                yield Observation(self.program, "equivalence", detail)
