"""``kvwatch gate``: every profile a target serves, at each concurrency, recorded in turns, judged.

    with target.started():                         (vLLM: one server for the gate)
        for each profile (side by side in --jobs lanes where the target's profiles are
        independent: kvwatch's engine, a server each):
            with target.serving(profile) as served:
                for each c:  served.run(RunSpec) -> RunRecord          (targets/)
                             -> judge: the detectors the target's signals allow -> RunResult
                             -> OUT/runs/<profile>-c<c>/record.json
    summarize -> GateSummary -> summary.json, gate.prom (+ Pushgateway), Grafana
                 annotations, --junit FILE, report.html, the console's result lines

Nothing here knows which target it runs: what it may ask of one is
``harness/target.py``. A run is judged only when it ran against a live
engine: a run whose engine died, or whose every request failed, is broken
(exit 3), so an engine that dies can never pass. Every path is built under
``--out`` from checked names (``harness/outputs.py``).
"""

from __future__ import annotations

import contextlib
import json
import time
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from kvwatch.gate.options import GateOptions
from kvwatch.gate.outputs.console import told
from kvwatch.gate.outputs.junit import write_junit
from kvwatch.gate.outputs.summary import GateSummary, coverage_line, summarize, write_summary
from kvwatch.gate.verdicts.detectors import detector_set
from kvwatch.gate.verdicts.judge import RunResult, broken, judge
from kvwatch.harness import outputs
from kvwatch.harness.progress import Progress
from kvwatch.harness.run_record import Counts
from kvwatch.harness.target import RunSpec, Served, Target
from kvwatch.processes import ServerError

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


def run_gate(opts: GateOptions, target: Target) -> tuple[GateSummary, int]:
    """Run everything; the summary and the exit code (0, 1, 3, or 130 when
    interrupted: the runs finished by then are judged and written, marked
    ``"interrupted": true``)."""
    opts.validate()
    profiles = target.selected(opts.profiles)
    outputs.mark(opts.out)
    results: list[RunResult] = []
    started = time.monotonic()
    progress = Progress(
        [(p.name, c) for p in profiles for c in opts.concurrency], opts.progress, tell=opts.result
    )
    try:
        _run_profiles(opts, target, profiles, progress, results)
        interrupted = False
    except KeyboardInterrupt:
        interrupted = True
        opts.progress(f"interrupted: writing what the {len(results)} finished runs found")
    summary = summarize(
        results, target.faults, target=target.name, interrupted=interrupted, strict=opts.strict
    )
    summary = replace(summary, elapsed_s=round(time.monotonic() - started, 1))
    if not interrupted:
        summary = replace(summary, published=publish(summary, opts))
    write_summary(summary, opts.out)
    if opts.junit is not None:
        write_junit(summary, opts.junit)
    if interrupted:
        opts.result(f"verdict: interrupted ({summary.elapsed_s} s) -> {opts.out}")
        return summary, EXIT_INTERRUPTED
    if opts.report:
        from kvwatch.gate.outputs.report import write_report

        opts.progress(f"writing {opts.out / 'report.html'}")
        write_report(summary, opts.out)
    if line := coverage_line(summary):
        opts.result(line)
    opts.result(f"verdict: {summary.verdict}{summary.why()} ({summary.elapsed_s} s) -> {opts.out}")
    return summary, summary.exit_code


def _run_profiles(
    opts: GateOptions, target: Target, profiles, progress: Progress, results: list
) -> None:
    """Every profile at every concurrency, appending each judged run to ``results``
    in the plan's order, whether the profiles ran one after another or side by side."""
    with contextlib.ExitStack() as shared:
        try:
            shared.enter_context(target.started(progress))
            down = None
        except ServerError as exc:
            down = str(exc)
        lanes = opts.lanes(target.independent_profiles, len(profiles))
        if lanes == 1:
            for profile in profiles:
                _serve_profile(opts, target, profile, progress, down, results)
            return
        done: dict[str, list[RunResult]] = {p.name: [] for p in profiles}
        with ThreadPoolExecutor(lanes, thread_name_prefix="kvwatch-lane") as pool:
            lanes_running = [
                pool.submit(_serve_profile, opts, target, p, progress.lane(), down, done[p.name])
                for p in profiles
            ]
            try:
                futures.wait(lanes_running)
            except KeyboardInterrupt:
                progress.cancel.set()  # each lane stops its run and its server, then ends
        for profile in profiles:
            results += done[profile.name]
        if progress.cancelled:
            raise KeyboardInterrupt
        for lane in lanes_running:
            lane.result()  # a lane's own exception, as one run after another would raise it


def _serve_profile(
    opts: GateOptions, target: Target, profile, progress, down: str | None, results: list
) -> None:
    """One profile served, run at each concurrency; each judged run appended to
    ``results`` as it ends (an interrupt keeps the finished ones)."""
    with contextlib.ExitStack() as serving:
        try:
            if progress.cancelled:
                raise KeyboardInterrupt
            if down is not None:
                raise ServerError(down)
            served = serving.enter_context(target.serving(profile, progress))
        except ServerError as exc:
            results += [
                broken(profile.name, c, opts.turns_for(profile), str(exc)) for c in opts.concurrency
            ]
            progress.runs_skipped(opts.concurrency)
            progress.say(f"    ERROR: {exc}")
            return
        for c in opts.concurrency:
            if progress.cancelled:
                raise KeyboardInterrupt
            progress.run_started(profile.name, c)
            results.append(_run_one(opts, target, served, profile, c, progress))
            told(progress, results[-1])


def _run_one(
    opts: GateOptions, target: Target, served: Served, profile, c: int, progress: Progress
) -> RunResult:
    where = outputs.child(opts.out, "runs", f"{profile.name}-c{c}")
    where.mkdir(parents=True, exist_ok=True)
    (where / "record.json").unlink(missing_ok=True)
    spec = RunSpec(
        profile=profile,
        concurrency=c,
        turns=opts.turns_for(profile),
        warmup=opts.warmup,
        seed=opts.seed,
        where=where,
        progress=progress,
        locust_workers=opts.locust_workers,
        run_timeout=opts.run_timeout,
    )
    run = served.run(spec)
    if run.error and not run.turns:  # nothing recorded, or a record not to judge
        return broken(profile.name, c, opts.turns_for(profile), run.error)
    sent = run.requests or Counts(status={}, failed=0, broken_turns=0)
    if run.error is None and (dead := sent.unserved()):
        run = run._replace(error=dead)
    (where / "record.json").write_text(json.dumps(run.to_json()))
    return judge(
        profile.name,
        c,
        run,
        requests=sent.requests,
        errors=sent.errors,
        detectors=detector_set(target.signals),
    )


def publish(summary: GateSummary, opts: GateOptions) -> dict[str, str]:
    """The verdict as metrics (``OUT/gate.prom``, a Pushgateway) and Grafana annotations.

    A failure here is reported, not fatal: the verdict and the exit code stand.
    """
    from kvwatch.gate.outputs import metrics

    done = metrics.export(summary, opts.out, opts.pushgateway)
    if done.get("pushgateway", "").startswith("error"):
        opts.progress(f"warning: could not push the verdict: {done['pushgateway']}")
    if opts.grafana_url:
        from grafana_client.client import GrafanaException

        from kvwatch.dashboards import push
        from kvwatch.gate.outputs import annotate

        try:
            api = push.connect(opts.grafana_url, opts.grafana_token)
            done["grafana"] = f"{annotate.post(api, summary)} annotations"
        except (OSError, GrafanaException) as exc:
            done["grafana"] = f"error: {exc}"
            opts.progress(f"warning: could not annotate {opts.grafana_url}: {exc}")
    return done
