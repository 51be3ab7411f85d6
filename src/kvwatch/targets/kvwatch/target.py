"""kvwatch's own engine as a gate target: ``kvwatch serve --enable-probe`` per profile.

Every profile runs on a server of its own, started with the profile's engine
config (small pools, so pressure, pruning and retraction happen within a few
turns) and the faults asked for, and shared by that profile's
concurrencies. Its records carry every signal, so every detector judges it::

    serving(profile)   kvwatch serve --config OUT/servers/P/engine.json --enable-probe
                       --probe-token T --run-dir OUT/spans/P [--inject F]...
                       and a cache-off reference engine of the same model
    run(spec)          coverage before -> Locust turns (probes over /debug/*, heap
                       samples up to c = HEAP_UP_TO or where the profile asks,
                       per-step watching, replay candidates) -> coverage after ->
                       the comparable requests replayed on the reference
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from kvwatch import MODEL_NAME
from kvwatch.engine.faults import parse_faults
from kvwatch.engine.overrides import apply_overrides, assignment
from kvwatch.harness import outputs
from kvwatch.harness.locust_run import HANDOVER, run_turns
from kvwatch.harness.plan import GaugePreset, ProbeSpec, RunPlan, preset
from kvwatch.harness.profiles import PROFILES, Profile, merge, soak_profile
from kvwatch.harness.progress import Progress
from kvwatch.harness.run_record import RunRecord, Signal
from kvwatch.harness.soak_load import SoakLoad, SoakSpec
from kvwatch.harness.sources import HttpSource
from kvwatch.harness.target import RunSpec, Served, Target
from kvwatch.harness.time_spent import TimeSpent, engine_cpu
from kvwatch.instrumentation.coverage import since
from kvwatch.targets.kvwatch.replay import choose
from kvwatch.targets.kvwatch.serve import EngineServer

# The server traces its heap (tracemalloc, one frame) in every profile's runs up
# to this concurrency, and at every one for profiles that ask (``Profile.heap``):
# tracing costs every allocation, and at c = 8 the agentic-trie profile's
# per-step probes ran 3.4x slower with it (144 s against 42 s).
HEAP_UP_TO = 2
SOURCE = "kvwatch.harness.sources:HttpSource.for_plan"
# kvwatch serve reads its engine afresh at every scrape: no wait past a gauge cache
SCRAPE_SETTLE_S = 0.0


class KvwatchTarget(Target):
    name = "kvwatch"
    signals = frozenset(Signal)
    independent_profiles = True  # a server of its own per profile

    def __init__(
        self,
        out: Path,
        *,
        faults: tuple[str, ...] = (),
        model: str = MODEL_NAME,
        max_replays: int | None = None,
        gauges: GaugePreset | None = None,
        seed: int = 0,
        engine_sets: tuple[str, ...] = (),
    ) -> None:
        parse_faults(faults)  # ValueError: an unknown fault
        if max_replays is not None and max_replays < 1:
            raise ValueError("--max-replays must be >= 1")
        self.out, self.faults, self.model, self.max_replays = out, tuple(faults), model, max_replays
        self.gauges = gauges or preset("kvwatch")
        self.seed = seed
        self.sets = tuple(assignment(s) for s in engine_sets)  # ValueError: not KEY=VALUE
        for profile in PROFILES.values():  # ValueError: a set that no engine config takes
            self.engine(profile)

    def profiles(self) -> Mapping[str, Profile]:
        return PROFILES

    def soak_profile(self, names: Sequence[str]) -> Profile:
        return soak_profile(tuple(names))

    def engine_config(self, profile: Profile) -> dict:
        """What ``profile`` is served with: its engine config, the failpoints seeded
        with the gate's seed, then every ``--engine-set`` in order."""
        config = profile.engine_config()
        if config.get("cache", {}).get("failpoints") is not None:
            config = merge(config, {"cache": {"failpoints": {"seed": self.seed}}})
        for assigned in self.sets:
            config = merge(config, assigned)
        return config

    def engine(self, profile: Profile):
        """``engine_config(profile)`` as the ``EngineConfig`` it builds (ValueError
        when it builds none)."""
        from kvwatch.engine import EngineConfig

        return apply_overrides(EngineConfig(), self.engine_config(profile))

    @contextlib.contextmanager
    def serving(self, profile: Profile, progress: Progress) -> Iterator[KvwatchServed]:
        progress.say(f"starting kvwatch serve for {profile.name}")
        server = self._start(profile)
        try:
            yield KvwatchServed(self, profile, server)
        finally:
            server.stop()

    def _start(self, profile: Profile) -> EngineServer:
        where = outputs.child(self.out, "servers", profile.name)
        where.mkdir(parents=True, exist_ok=True)
        config = where / "engine.json"
        config.write_text(json.dumps(self.engine_config(profile), indent=2))
        spans = outputs.child(self.out, "spans", profile.name)
        return EngineServer(config, self.faults, where / "server.log", spans, profile.serve_flags)


class KvwatchServed(Served):
    def __init__(self, target: KvwatchTarget, profile: Profile, server: EngineServer) -> None:
        self.target, self.profile, self.server = target, profile, server
        self._reference = None
        self._first_run = True  # the server's start-up is counted with it

    @property
    def reference(self):
        """The cache-off engine of the served model, built on the first replay."""
        if self._reference is None:
            from kvwatch.targets.kvwatch.replay import Reference  # torch: only once a run needs it

            self._reference = Reference(self.target.engine(self.profile))
        return self._reference

    def exited(self) -> str | None:
        return self.server.exited()

    def soak(self, spec: SoakSpec) -> RunRecord:
        users = self.profile.user
        users = (users,) if isinstance(users, str) else users
        return SoakLoad(spec, self.server, users, self.target.model).record()

    def run(self, spec: RunSpec) -> RunRecord:
        if gone := self.server.exited():
            return RunRecord(turns=(), error=f"not run: {gone}")
        started = time.monotonic()
        counted = HttpSource(
            self.server.url,
            white_box=True,
            token=self.server.token,
            metrics_url=f"{self.server.url}/metrics",
            metrics_settle=SCRAPE_SETTLE_S,
        )
        # c = 1 runs the load as written (a seed's sequence, step by step); the
        # cache's failure paths are taken at c >= 2, on the schedule's next hits
        counted.arm_failpoints(spec.concurrency > 1)
        before, work = counted.coverage(), counted.timing()
        counters = counted.gauges(self.target.gauges.counters)
        run = run_turns(self.plan(spec), spec, self.profile.user)
        if gone := self.server.exited():
            return RunRecord(turns=(), error=gone)  # a partial record is not judged
        if not run.turns and run.error:
            return run
        # everything the server did for this run, its users' setup too
        run = run._replace(
            coverage=since(before, counted.coverage()),
            counters=risen(counters, counted.gauges(self.target.gauges.counters)),
        )
        work = engine_cpu(work, counted.timing())
        replay_started = time.monotonic()
        if run.error is None:
            run = self.replayed(run, spec.progress)
        spent = (run.spent or TimeSpent(run_s=0.0))._replace(
            run_s=time.monotonic() - started,
            server_start_s=self.server.start_s if self._first_run else 0.0,
            replay_s=time.monotonic() - replay_started,
            **work,
        )
        self._first_run = False
        return run._replace(spent=spent)

    def plan(self, spec: RunSpec) -> RunPlan:
        profile, server, c = self.profile, self.server, spec.concurrency
        return RunPlan(
            profile=profile.name,
            concurrency=c,
            target=server.url,
            record=str(spec.where / HANDOVER),
            turns=spec.turns,
            warmup=spec.warmup,
            seed=spec.seed,
            metrics_url=f"{server.url}/metrics",
            metrics_settle=SCRAPE_SETTLE_S,
            source=ProbeSpec(
                factory=SOURCE,
                white_box=True,
                token=server.token,
                watch=True,
                heap=profile.heap or c <= HEAP_UP_TO,
                census=True,  # at every concurrency: it costs two counts a run
                replays=True,
                flush_every_turn=profile.flush_every_turn,
            ),
            test_controls=True,
            model=self.target.model,
            gauges=self.target.gauges,
        )

    def replayed(self, run: RunRecord, progress: Progress) -> RunRecord:
        """``run`` with its comparable requests (at most ``--max-replays``, those that
        exercised a boundary first, the rest spread over
        the run) replayed on the cache-off reference engine."""
        started = time.monotonic()
        chosen = choose(list(run.candidates), self.target.max_replays)
        marked = sum(1 for c in chosen if c.marks)
        progress.say(
            f"    replaying {len(chosen)} requests on a cache-off engine "
            f"({marked} resumed at a boundary, retracted, recovered or paused)"
        )
        run = run._replace(replays=self.reference.replay(chosen))
        progress.say(
            f"    {len(run.replays)} of {run.finished} finished requests (greedy or seeded) "
            f"replayed on a cache-off engine ({time.monotonic() - started:.1f} s)"
        )
        return run


def risen(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Each counter series' rise between two readings (a series first seen after
    counts from 0)."""
    return {series: value - before.get(series, 0.0) for series, value in after.items()}
