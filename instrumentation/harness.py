"""The in-process turn harness: the gate's barrier protocol without HTTP.

    baseline probe
    for turn in turns:   workload submits ─► step until idle (probe every step,
                         cut tool calls mid-prefill, push requests out now and
                         then) ─► barrier probe, heap sample, gauge readings
    close sessions, flush ─► drained probe ─► replay a sample with the cache off

It returns a ``RunRecord`` for the detectors. The gauges come through the
real instrumentation (an ``InMemoryMetricReader``), as a black box would see
them.
"""

from __future__ import annotations

import json
import random
import time
import tracemalloc
from dataclasses import dataclass, replace
from pathlib import Path

from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import kvwatch.engine
from kvwatch.contracts import ProbeReport
from kvwatch.engine import Engine, EngineConfig, SchedulerConfig
from kvwatch.engine.config import PrefixCacheMode
from kvwatch.engine.events import BatchComputed
from kvwatch.engine.request import Status
from kvwatch.instrumentation import Telemetry, instrument
from kvwatch.instrumentation import names as n
from kvwatch.instrumentation.detectors import HeapSample, Replay, RunRecord, Turn
from kvwatch.instrumentation.workloads import PARAMS, Workload, engine_config

ENGINE_DIR = str(Path(kvwatch.engine.__file__).parent)
MAX_STEPS_PER_TURN = 5000
CUT_AT = 48  # tool calls are cut once this much of their prompt is computed
RETRACT_EVERY = 6  # steps between forced retractions
DISCONNECT_TURNS = (0,)  # session turns cut mid-verify (records then fill up in the warm-up)
HEAP_SITES = 40  # allocation sites followed per heap sample
# Frames kept per traced allocation: enough to show the engine code path of a
# growing site (each extra frame costs every allocation, about 10 % per frame here).
HEAP_FRAMES = 4


@dataclass(frozen=True)
class HarnessConfig:
    workload: str = "agentic"
    concurrency: int = 2
    turns: int = 6
    warmup: int = 2
    seed: int = 0
    faults: frozenset = frozenset()
    heap: bool = True
    replays: int = 3


def run(cfg: HarnessConfig) -> RunRecord:
    engine = Engine(engine_config(cfg.workload, cfg.faults))
    reader = InMemoryMetricReader()
    telemetry = Telemetry(metric_readers=[reader], otlp=False)
    inst = instrument(engine.events, engine.stats, telemetry, stats_max_age=0)
    load = Workload(cfg.workload, cfg.concurrency, seed=cfg.seed, warmup=cfg.warmup)
    rng = random.Random(cfg.seed + 1)
    tracing = cfg.heap and not tracemalloc.is_tracing()
    if tracing:
        tracemalloc.start(HEAP_FRAMES)
    try:
        baseline = engine.probe()
        load.start(engine)
        turns, done, heap_prev, error = [], [], None, None
        for t in range(cfg.turns):
            probes, finished = _turn(engine, load, t, rng)
            done += [(t, p, o) for p, o in finished]
            if load.flush_every_turn:
                engine.flush_cache()
            probes.append(_probe(engine))
            heap, heap_prev = _heap(heap_prev) if cfg.heap else (None, None)
            gauges = _gauges(reader, load.conversations)
            turns.append(
                Turn(
                    t,
                    probes,
                    load.conversations,
                    load.context_tokens(engine),
                    heap,
                    gauges,
                    time.time(),
                )
            )
        try:
            load.stop(engine)
            engine.flush_cache()
            drained = engine.probe()
        except Exception as exc:  # a fault can corrupt the cache past closing it
            drained, error = None, f"closing the run failed: {exc!r}"
    finally:
        if tracing:
            tracemalloc.stop()
        inst.close()
        telemetry.shutdown()
    turns = [
        t._replace(probes=tuple(ProbeReport.from_json(json.loads(p)) for p in t.probes))
        for t in turns
    ]
    replays = _replays(engine.config, done, cfg, rng)
    return RunRecord(tuple(turns), cfg.warmup, baseline, drained, replays, error)


def _probe(engine: Engine) -> str:
    """A probe kept as one JSON string while the heap is traced: a few hundred
    small dicts per probe would swamp the snapshots (and their filtering)."""
    return json.dumps(engine.probe().to_json())


def _turn(engine: Engine, load: Workload, t: int, rng: random.Random):
    keep, cut, retry = load.submit(engine, t)
    probes, finished = [], []

    def disconnect_mid_verify(e: BatchComputed) -> None:
        """In the warm-up, a client leaves while its session turn verifies drafts
        that reach into a new page: the worst moment for the slot's tail. Later
        turns run whole, so their records pile up (or not)."""
        if t not in DISCONNECT_TURNS:
            return
        p = engine.cache.page_size
        for rid in e.request_ids:
            work = engine.scheduler.in_flight.get(rid)
            if not (work and work.drafts and work.request.session):
                continue
            if -(-(work.start + 1 + len(work.drafts)) // p) > -(-work.start // p):
                engine.abort(rid)

    unsubscribe = engine.events.subscribe(BatchComputed, disconnect_mid_verify)
    for _ in range(MAX_STEPS_PER_TURN):
        if not engine.has_unfinished():
            break
        engine.step()
        for rid in list(cut):
            req = engine.requests.get(rid)
            if req is None or req.done:
                cut.remove(rid)
            elif req.holder is not None and req.holder.computed_len >= CUT_AT:
                engine.pause(rid) if rng.random() < 0.3 else engine.abort(rid)
                if req.status is Status.PAUSED:
                    engine.abort(rid)
                cut.remove(rid)
        for rid, prompt in list(retry):
            req = engine.requests[rid]
            if req.status is Status.RUNNING and _owns_state(req):
                engine.retract(rid)  # as pressure would; its client sends it again
                engine.add_request(prompt, PARAMS)
                retry.remove((rid, prompt))
            elif req.done:
                retry.remove((rid, prompt))
        if engine.step_count % RETRACT_EVERY == 0:  # as pool pressure would
            running = [r for r in engine.scheduler.running if r.status is Status.RUNNING]
            prefilling = [r for r in running if r.holder.computed_len < r.prompt_len - 1]
            if len(running) > 1:
                engine.retract(rng.choice(prefilling or running).id)
        probes.append(_probe(engine))
    else:
        raise RuntimeError(f"turn {t} did not drain in {MAX_STEPS_PER_TURN} steps")
    unsubscribe()
    for rid, conv in keep:
        out = engine.take(rid)
        if out.error is None:
            load.finished(conv, out.prompt_token_ids, out.token_ids)
            finished.append((tuple(out.prompt_token_ids), tuple(out.token_ids)))
    for rid in [r for r, req in engine.requests.items() if req.done]:
        engine.take(rid)  # session turns and cut tool calls
    return probes, finished


def _owns_state(req) -> bool:
    """Whether the request has committed state of its own: a complete snapshot
    on its locked path below where it resumed, so once retracted it recovers
    from a node that only it has reached."""
    h = req.holder
    return h.lock_node is not None and any(
        n.has_complete_snapshot for n in h.lock_node.path() if n.depth > req.cached_tokens
    )


def _heap(prev: tracemalloc.Snapshot | None):
    """Bytes the engine's code allocated and still holds. (The harness keeps
    copies it made itself, and probes as JSON strings, so its own retention
    is not counted.)"""
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, f"{ENGINE_DIR}/*")])
    sites = snap.statistics("lineno")
    traced = sum(stat.size for stat in sites)
    by_site = {
        f"{s.traceback[0].filename}:{s.traceback[0].lineno}": s.size for s in sites[:HEAP_SITES]
    }
    top = ()
    if prev is not None:
        top = tuple(
            (s.size_diff, tuple(f"{f.filename}:{f.lineno}" for f in s.traceback))
            for s in snap.compare_to(prev, "traceback")[:5]
        )
    return HeapSample(traced, top, by_site), snap


def _gauges(reader: InMemoryMetricReader, conversations: int) -> dict[str, float]:
    """From the exported gauges alone: state pages that eviction cannot take back
    (used minus evictable), per live conversation, per state group."""
    by = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name != n.POOL_PAGES:
                    continue
                for p in metric.data.data_points:
                    a = p.attributes
                    if a.get(n.FAMILY) == "state":
                        by[a[n.GROUP], a[n.STATE]] = p.value
    groups = {g for g, _ in by}
    return {
        f"{n.POOL_PAGES}{{group={g}, used - evictable}}/conversation": (
            by.get((g, "used"), 0) - by.get((g, "evictable"), 0)
        )
        / max(conversations, 1)
        for g in sorted(groups)
    }


def _replays(config: EngineConfig, done, cfg: HarnessConfig, rng: random.Random):
    """Replay a sample of finished greedy requests on a cache-off engine."""
    late = [d for d in done if d[0] >= cfg.warmup] or done
    sample = rng.sample(late, min(cfg.replays, len(late)))
    if not sample:
        return ()
    off = Engine(
        EngineConfig(
            model=config.model,
            cache=replace(
                config.cache,
                mode=PrefixCacheMode.OFF,
                full_kv=replace(config.cache.full_kv, capacity=4096),
            ),
            scheduler=SchedulerConfig(max_running=1, chunk_size=4096, max_batch_tokens=4096),
        )
    )
    out = []
    for turn, prompt, cached in sample:
        reference = off.generate([list(prompt)], PARAMS)[0].token_ids
        out.append(Replay(turn, prompt, cached, tuple(reference)))
    return tuple(out)
