"""``kvwatch gate``: load profiles at each concurrency, recorded in turns, judged.

    for each profile:
        kvwatch serve --enable-probe --config <profile's engine>   (unless --target)
        for each c:  Locust headless (its own processes) with a run plan
                     -> OUT/runs/<profile>-c<c>/{record.json, locust*.csv, locust.html}
                     -> RunRecord -> detectors -> RunResult
    OUT/summary.json, OUT/report.html, OUT/spans/<profile>/spans.jsonl, --junit FILE

The barrier and the probes happen inside the Locust run (see
``recorder.py``); this module starts processes, follows their progress,
replays each run's greedy and seeded requests on a cache-off engine of the served model
(``instrumentation/replay.py``) and judges what they recorded. With
``--target`` the engine is someone else's: nothing is injected, probed or
replayed, and only black-box detectors run. With ``--engine vllm`` the gate
starts vLLM from ``--model DIR`` itself, once for every profile, with
kvwatch's probe in its engine core (``targets/``): the black-box profiles
run, and the detectors judge its block pool's audit and its usage gauge.

A run is judged only when it ran against a live engine: if the embedded
server exits during a run, or every request of a run failed, the run is an
error (exit 3) and its partial record is not judged, so an engine that dies
can never pass. Every path is built under ``--out`` from checked names
(``outputs.py``).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from kvwatch import MODEL_NAME, streams
from kvwatch.engine.faults import parse_faults
from kvwatch.gate import outputs
from kvwatch.gate import profiles as catalog
from kvwatch.gate import summary as verdicts
from kvwatch.gate.console import Progress
from kvwatch.gate.detectors import IDS, MIN_JUDGED_TURNS, RunRecord
from kvwatch.gate.locust_run import run_locust
from kvwatch.gate.plan import RunPlan, preset
from kvwatch.gate.run_record import Counts
from kvwatch.gate.servers import EngineServer, ServerError
from kvwatch.gate.sources import HttpSource
from kvwatch.telemetry.coverage import since

BLACK_BOX_DETECTORS = ("gauge-trend", "requests")
# what vLLM's audit and gauges can tell (targets/vllm_source.py): no heap, no
# registries, no replay of a cache-off reference
VLLM_DETECTORS = ("allocator", "refcount", "tree", "requests", "gauge-trend")
ENGINES = ("kvwatch", "vllm")
# The server traces its heap (tracemalloc, one frame) in every profile's runs up
# to this concurrency, and at every one for profiles that ask (``Profile.heap``):
# tracing costs every allocation, and at c = 8 the agentic-trie profile's
# per-step probes ran 3.4x slower with it (144 s against 42 s).
HEAP_UP_TO = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


@dataclass(frozen=True, kw_only=True)
class GateOptions:
    profiles: tuple[str, ...] = ()  # () = every profile the target can run
    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    turns: int = 6
    warmup: int = 2
    faults: tuple[str, ...] = ()
    out: Path = Path("kvwatch-out")
    junit: Path | None = None
    target: str | None = None
    metrics_url: str | None = None
    gauges: str = "kvwatch"
    extra_gauges: tuple[str, ...] = ()
    locust_workers: int = 0
    seed: int = 0
    model: str = MODEL_NAME
    max_replays: int | None = None  # None: every comparable request
    run_timeout: float = 600.0
    report: bool = True
    pushgateway: str | None = None  # push the verdict metrics here
    grafana_url: str | None = None  # annotate the findings here
    grafana_token: str | None = None
    engine: str = "kvwatch"  # or "vllm": started from --model DIR, probed in its engine core
    vllm_python: str = sys.executable  # a Python that has vLLM (and kvwatch, for its plugin)
    vllm_args: tuple[str, ...] = ()  # further arguments for vLLM's server
    progress: Callable[[str], None] = field(default=streams.err)  # what it is doing
    result: Callable[[str], None] = field(default=streams.out)  # run results, the verdict

    def validate(self) -> None:
        """Usage errors (the CLI's exit 2) as ValueError."""
        for name in self.profiles:
            catalog.get(name)
        if not self.concurrency or any(not 1 <= c <= 64 for c in self.concurrency):
            raise ValueError("-c takes concurrencies in 1..64, e.g. 1,2,4,8")
        if self.turns < self.warmup + MIN_JUDGED_TURNS:
            raise ValueError(
                f"--turns must be at least {self.warmup + MIN_JUDGED_TURNS} "
                f"({self.warmup} warm-up turns and {MIN_JUDGED_TURNS} judged ones)"
            )
        if self.engine not in ENGINES:
            raise ValueError(f"--engine is one of {', '.join(ENGINES)}, not {self.engine!r}")
        if self.engine == "vllm":
            _validate_vllm(self)
        else:
            parse_faults(self.faults)
        preset(self.gauges, self.extra_gauges)
        if (self.target is None) != (self.metrics_url is None):
            raise ValueError("--target and --metrics-url go together")
        if self.target is not None and self.faults:
            raise ValueError("--inject needs the embedded engine; it cannot reach a --target")
        if self.max_replays is not None and self.max_replays < 1:
            raise ValueError("--max-replays must be >= 1")
        if self.locust_workers < 0:
            raise ValueError("--locust-workers must be >= 0")
        for flag, url in (
            ("--target", self.target),
            ("--metrics-url", self.metrics_url),
            ("--pushgateway", self.pushgateway),
            ("--grafana-url", self.grafana_url),
        ):
            if url is not None and not _is_http_url(url):
                raise ValueError(f"{flag} takes an http(s) URL, not {url!r}")
        outputs.out_dir(self.out)
        if self.junit is not None:
            outputs.report_file("--junit", self.junit, self.out)

    @property
    def selected(self) -> tuple[catalog.Profile, ...]:
        if self.profiles:
            return tuple(catalog.get(p) for p in self.profiles)
        black_box = self.target is not None or self.engine == "vllm"
        return tuple(p for p in catalog.PROFILES.values() if not (black_box and p.kvwatch_api))


def run_gate(opts: GateOptions) -> tuple[dict, int]:
    """Run everything; returns the summary and the exit code (0, 1, 3, or 130
    when interrupted: the runs finished by then are judged and written, marked
    ``"interrupted": true``)."""
    opts.validate()
    outputs.mark(opts.out)
    results: list[verdicts.RunResult] = []
    started = time.monotonic()
    progress = Progress(
        [(p.name, c) for p in opts.selected for c in opts.concurrency],
        opts.progress,
        tell=opts.result,
    )
    try:
        _run_profiles(opts, progress, results)
        interrupted = False
    except KeyboardInterrupt:
        interrupted = True
        opts.progress(f"interrupted: writing what the {len(results)} finished runs found")
    summary = verdicts.summarize(results, opts.faults)
    summary["elapsed_s"] = round(time.monotonic() - started, 1)
    if interrupted:  # a finding stands; otherwise an unfinished gate is no pass
        summary["interrupted"] = True
        summary["verdict"] = "fail" if summary["verdict"] == "fail" else "error"
        verdicts.write(summary, opts.out, opts.junit)
        opts.result(f"verdict: interrupted ({summary['elapsed_s']} s) -> {opts.out}")
        return summary, EXIT_INTERRUPTED
    summary["published"] = publish(summary, opts)
    verdicts.write(summary, opts.out, opts.junit)
    if opts.report:
        from kvwatch.gate.report import write_report

        opts.progress(f"writing {opts.out / 'report.html'}")
        write_report(summary, opts.out)
    code = verdicts.exit_code(summary)
    if line := verdicts.coverage_line(summary):
        opts.result(line)
    opts.result(f"verdict: {summary['verdict']} ({summary['elapsed_s']} s) -> {opts.out}")
    return summary, code


def _run_profiles(opts: GateOptions, progress: Progress, results: list) -> None:
    """Every profile at every concurrency, appending each judged run to ``results``."""
    from kvwatch.gate.replay import Reference  # torch: only once the flags are good

    embedded = opts.target is None and opts.engine == "kvwatch"
    shared, broke = _start_vllm(opts) if opts.engine == "vllm" else (None, None)
    try:
        for profile in opts.selected:
            reference = Reference(profile_engine(profile)) if embedded else None
            try:
                if embedded:
                    progress.say(f"starting kvwatch serve for {profile.name}")
                server = _start_server(opts, profile) if embedded else shared
                if broke is not None:
                    raise ServerError(broke)
            except ServerError as exc:
                for c in opts.concurrency:
                    results.append(_broken(profile.name, c, opts.turns, str(exc)))
                progress.runs_skipped(opts.concurrency)
                progress.say(f"    ERROR: {exc}")
                continue
            try:
                for c in opts.concurrency:
                    progress.run_started(profile.name, c)
                    results.append(_run_one(opts, progress, profile, c, server, reference))
                    progress.run_finished(results[-1])
            finally:
                if embedded:
                    server.stop()
    finally:
        if shared is not None:
            shared.stop()


def publish(summary: dict, opts: GateOptions) -> dict[str, str]:
    """The verdict as metrics (``OUT/gate.prom``, a Pushgateway) and Grafana annotations.

    A failure here is reported, not fatal: the verdict and the exit code stand.
    """
    from kvwatch.gate import gate_metrics

    done = gate_metrics.export(summary, opts.out, opts.pushgateway)
    if done.get("pushgateway", "").startswith("error"):
        opts.progress(f"warning: could not push the verdict: {done['pushgateway']}")
    if opts.grafana_url:
        from grafana_client.client import GrafanaException

        from kvwatch.dashboards import annotate, push

        try:
            api = push.connect(opts.grafana_url, opts.grafana_token)
            done["grafana"] = f"{annotate.post(api, summary)} annotations"
        except (OSError, GrafanaException) as exc:
            done["grafana"] = f"error: {exc}"
            opts.progress(f"warning: could not annotate {opts.grafana_url}: {exc}")
    return done


def _is_http_url(url: str) -> bool:
    parts = urlparse(url)
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def _start_server(opts: GateOptions, profile: catalog.Profile) -> EngineServer:
    where = outputs.child(opts.out, "servers", profile.name)
    where.mkdir(parents=True, exist_ok=True)
    config = where / "engine.json"
    config.write_text(json.dumps(profile.engine_config(), indent=2))
    spans = outputs.child(opts.out, "spans", profile.name)
    return EngineServer(config, opts.faults, where / "server.log", spans, profile.serve_flags)


def _validate_vllm(opts: GateOptions) -> None:
    from kvwatch.targets.vllm_plugin import FAULTS

    if opts.target is not None:
        raise ValueError("--engine vllm starts vLLM itself; it does not take --target")
    if not (Path(opts.model) / "config.json").is_file():
        raise ValueError(f"--engine vllm takes --model DIR, a model's directory: {opts.model!r}")
    if len(opts.faults) > 1 or not set(opts.faults) <= set(FAULTS):
        raise ValueError(f"--engine vllm injects one fault of {', '.join(FAULTS)}")


def _start_vllm(opts: GateOptions):
    """vLLM serving ``--model DIR`` with kvwatch's probe, for every profile; or
    None and why it did not come up."""
    from kvwatch.targets.vllm_server import VllmServer

    log = outputs.child(opts.out, "servers", "vllm.log")
    opts.progress(f"starting vLLM ({opts.vllm_python}) with {opts.model}; log in {log}")
    try:
        server = VllmServer(
            opts.vllm_python,
            Path(opts.model),
            log,
            fault=opts.faults[0] if opts.faults else None,
            probe=True,
            served_name=Path(opts.model).name,
            extra=opts.vllm_args,
        )
    except ServerError as exc:
        return None, str(exc)
    return server, None


def profile_engine(profile: catalog.Profile):
    """The engine config the gate serves ``profile`` with (its overrides on the defaults)."""
    from kvwatch.engine import EngineConfig
    from kvwatch.engine.overrides import apply_overrides

    return apply_overrides(EngineConfig(), profile.engine_config())


def _run_one(
    opts: GateOptions, progress: Progress, profile: catalog.Profile, c: int, server, reference
) -> verdicts.RunResult:
    if server is not None and (gone := server.exited()):
        return _broken(profile.name, c, opts.turns, f"not run: {gone}")
    where = outputs.child(opts.out, "runs", f"{profile.name}-c{c}")
    where.mkdir(parents=True, exist_ok=True)
    record = where / "record.json"
    for stale in (record, Path(f"{record}.progress")):
        stale.unlink(missing_ok=True)
    target = server.url if server else opts.target
    vllm = opts.engine == "vllm"
    kvwatch = server is not None and not vllm  # kvwatch's own server, probed over /debug
    plan = _run_plan(opts, profile, c, server, target, record)
    (where / "plan.json").write_text(plan.to_json())
    counted = HttpSource(server.url, white_box=True, token=server.token) if kvwatch else None
    before = counted.coverage() if counted else {}
    error = run_locust(opts, progress, profile, c, target, where, record)
    if server is not None and (gone := server.exited()):
        return _broken(profile.name, c, opts.turns, gone)  # a partial record is not judged
    if error is None and not record.exists():
        error = "the load run ended without a record (see locust.log)"
    if error is not None:
        return _broken(profile.name, c, opts.turns, error)
    run = RunRecord.from_json(json.loads(record.read_text()))
    if counted is not None:  # everything the server did for this run, its users' setup too
        run = run._replace(coverage=since(before, counted.coverage()))
    if reference is not None and run.error is None:
        run = _replayed(opts, progress, run, reference, record)
    sent = run.requests or Counts(status={}, failed=0, broken_turns=0)
    requests, errors = sent.requests, sent.errors
    if run.error is None and (dead := no_service(requests, errors)):
        run = run._replace(error=dead)
    detectors = IDS if kvwatch else VLLM_DETECTORS if vllm else BLACK_BOX_DETECTORS
    return verdicts.judge(
        profile.name, c, run, requests=requests, errors=errors, detectors=detectors
    )


def _run_plan(
    opts: GateOptions, profile: catalog.Profile, c: int, server, target: str, record: Path
) -> RunPlan:
    """What the Locust run of ``profile`` at concurrency ``c`` is told: where to send
    load and write its record, and what to probe. White-box probes go to kvwatch's
    own server (``/debug``) or vLLM's probe; a ``--target`` gets none."""
    vllm = opts.engine == "vllm"
    kvwatch = server is not None and not vllm
    return RunPlan(
        profile=profile.name,
        concurrency=c,
        target=target,
        record=str(record),
        turns=opts.turns,
        warmup=opts.warmup,
        seed=opts.seed,
        metrics_url=f"{server.url}/metrics" if server else opts.metrics_url,
        probe=kvwatch,
        probe_token=server.token if kvwatch else None,
        vllm_probe=server.probe_url if vllm else None,
        heap=kvwatch and (profile.heap or c <= HEAP_UP_TO),
        flush_every_turn=profile.flush_every_turn,
        model=Path(opts.model).name if vllm else opts.model,
        gauges=preset(opts.gauges, opts.extra_gauges),
    )


def _replayed(
    opts: GateOptions, progress: Progress, run: RunRecord, reference, record: Path
) -> RunRecord:
    """``run`` with its comparable requests (at most ``--max-replays``, spread over
    the run) replayed on the cache-off ``reference`` engine; the record on disk is
    rewritten with the replays, so it holds what the detectors judge."""
    started = time.monotonic()
    chosen = spread(run.candidates, opts.max_replays)
    progress.say(f"    replaying {len(chosen)} requests on a cache-off engine")
    run = run._replace(replays=reference.replay(chosen))
    record.write_text(json.dumps(run.to_json()))
    progress.say(
        f"    {len(run.replays)} of {run.finished} finished requests (greedy or seeded) "
        f"replayed on a cache-off engine ({time.monotonic() - started:.1f} s)"
    )
    return run


def spread(items: list, most: int | None) -> list:
    """All of ``items``, or ``most`` of them evenly spread (first and last kept)."""
    if most is None or len(items) <= most:
        return list(items)
    if most == 1:
        return [items[-1]]
    step = (len(items) - 1) / (most - 1)
    return [items[round(i * step)] for i in range(most)]


def no_service(requests: int, errors: int) -> str | None:
    """Why a run's load says the engine never served it, or None."""
    if requests == 0:
        return "no request reached the server"
    if errors >= requests:
        return f"every one of the {requests} requests failed (see locust.log)"
    return None


def _broken(profile: str, c: int, turns: int, error: str) -> verdicts.RunResult:
    return verdicts.RunResult(
        profile=profile, concurrency=c, turns=turns, requests=0, errors=0, verdicts={}, error=error
    )
