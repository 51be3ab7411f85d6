"""The ``kvwatch`` command line.

Flags are parsed by ``kvwatch.parser``; the handlers here call into the
library and hold no logic of their own. Exit code 2 means a usage or config error (argparse's
convention, and the contract of ``kvwatch gate``). Every error the CLI
reports is one line on stderr, ``kvwatch SUBCOMMAND: ...``, never a
traceback: CI logs show it as it is, and scripts can grep it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from kvwatch import streams
from kvwatch.parser import GRAFANA_TOKEN_ENV, VLLM_PYTHON_ENV, build_parser

# A server that is up answers one GET well within this, however busy it is.
TARGET_TIMEOUT_S = 30.0


def _print_json(entries: list[dict]) -> int:
    streams.out(json.dumps(entries, indent=2))
    return 0


def _faults(args: argparse.Namespace) -> int:
    from kvwatch.engine.faults import REGISTRY
    from kvwatch.gate.verdicts.catches import HISTORY_TIER, catch_of

    entries = [{**info.as_dict(), **catch_of(info.name)._asdict()} for info in REGISTRY.values()]
    if args.json:
        return _print_json(entries)
    width = max(len(e["name"]) for e in entries)
    streams.out(f"{'fault':<{width}}  seed  summary (and what catches it)")
    for e in entries:
        streams.out(f"{e['name']:<{width}}  {e['seed']:<4}  {e['summary']}")
        where = (
            f"the {e['detector']} check of kvwatch histories"
            if e["profile"] == HISTORY_TIER
            else f"{e['detector']} on profile {e['profile']}"
        )
        streams.out(f"{'':<{width}}        caught by {where}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from kvwatch.serve import ServeOptions, engine_config, serve
    from kvwatch.server import ServerSettings

    try:
        settings = ServerSettings(
            enable_probe=args.enable_probe,
            probe_token=args.probe_token,
            capture_content=args.capture_content,
            max_body_bytes=args.max_body_bytes,
            max_header_bytes=args.max_header_bytes,
            session_idle_timeout_s=args.session_idle_timeout,
            step_by_step=args.step_by_step,
        )
        overrides = _read_config(args.config) if args.config else {}
        if args.run_dir is not None:
            from kvwatch.harness.outputs import directory

            directory("--run-dir", args.run_dir)  # spans.jsonl goes in it, nowhere else
        options = ServeOptions(
            overrides=overrides,
            host=args.host,
            port=args.port,
            prefix_cache=args.prefix_cache,
            device=args.device,
            faults=tuple(args.inject),
            settings=settings,
            run_dir=args.run_dir,
            log_level=args.log_level,
        )
        engine_config(options)  # fail fast on a bad flag or KVWATCH_FAULTS
    except ValueError as exc:  # also --step-by-step without --enable-probe
        streams.err(f"kvwatch serve: {exc}")
        return 2
    if args.probe_token and not args.enable_probe:
        streams.err("kvwatch serve: --probe-token needs --enable-probe")
        return 2
    return serve(options)


def _profiles(args: argparse.Namespace) -> int:
    from kvwatch.gate.verdicts.catches import exposed_by
    from kvwatch.harness.profiles import PROFILES

    entries = [p.as_dict(exposed_by(p.name)) for p in PROFILES.values()]
    if args.json:
        return _print_json(entries)
    width = max(len(e["name"]) for e in entries)
    streams.out(f"{'profile':<{width}}  black-box  summary")
    for e in entries:
        box = "yes" if e["black_box"] else "no"
        streams.out(f"{e['name']:<{width}}  {box:<9}  {e['summary']}")
        streams.out(f"{'':<{width}}             exposes: {', '.join(e['faults']) or '-'}")
    return 0


# --quick, the pull-request tier: every profile at c = 2 (failpoints armed, two
# conversations contending), a spread of 16 requests replayed per run. It is the
# mutation score's fast stage (mutation/score.py), so its catch rate is measured
# on the same mutants as the default gate's (docs/mutation-score.md)
QUICK_CONCURRENCY = (2,)
QUICK_MAX_REPLAYS = 16

# gate flags a soak has no use for, by the argparse dest that holds them: given with
# --soak they are a usage error, not silently ignored
NOT_FOR_SOAK = {
    "turns": "--turns",
    "max_replays": "--max-replays",
    "target": "--target",
    "metrics_url": "--metrics-url",
    "gauges": "--gauges",
    "gauge": "--gauge",
    "locust_workers": "--locust-workers",
    "jobs": "--jobs",
    "quick": "--quick",
    "pushgateway": "--pushgateway",
    "grafana_url": "--grafana-url",
    "engine": "--engine",
    "vllm_python": "--vllm-python",
    "vllm_arg": "--vllm-arg",
    "vllm_version": "--vllm-version",
    "sglang_version": "--sglang-version",
    "sglang_cache": "--sglang-cache",
    "page_size": "--page-size",
    "lightllm_src": "--lightllm-src",
    "lightllm_cache": "--lightllm-cache",
    "no_report": "--no-report",  # a soak writes no report.html to skip
    "grafana_token": "--grafana-token",  # a soak annotates no Grafana
}


def _given(value: object) -> bool:
    """Whether a flag was given, judged by its value: every flag in NOT_FOR_SOAK
    defaults to None, [] or (a store_true flag) False, and no value given on the
    command line is any of those (``--turns 0`` is 0, which counts as given)."""
    return not (value is None or value is False or value == [])


def _soak(args: argparse.Namespace) -> int:
    from kvwatch.gate.soak import SoakOptions, run_soak
    from kvwatch.harness.profiles import SOAK_PROFILES
    from kvwatch.targets.select import TargetFlags, choose

    given = [flag for dest, flag in NOT_FOR_SOAK.items() if _given(getattr(args, dest))]
    if given:
        streams.err(f"kvwatch gate: --soak does not take {', '.join(given)}")
        return 2
    if args.c is not None and len(args.c) != 1:
        streams.err("kvwatch gate: --soak runs at one concurrency, e.g. -c 4")
        return 2
    options = SoakOptions(
        duration=args.soak,
        profiles=tuple(args.profile) or SOAK_PROFILES,
        concurrency=args.c[0] if args.c else 4,
        out=args.out,
        junit=args.junit,
        strict=args.strict,
        seed=args.seed,
    )
    flags = TargetFlags(
        faults=tuple(args.inject),
        model=args.model,
        seed=args.seed,
        engine_sets=tuple(args.engine_set),
    )
    try:
        target = choose(flags, args.out)
        target.soak_profile(options.profiles)
    except ValueError as exc:
        streams.err(f"kvwatch gate: {exc}")
        return 2
    return _validated_run(options, lambda opts: run_soak(opts, target))


def _gate(args: argparse.Namespace) -> int:
    from kvwatch.gate.options import GateOptions
    from kvwatch.gate.pipeline import run_gate
    from kvwatch.targets.select import TargetFlags, choose

    if args.soak is not None:
        return _soak(args)
    if args.quick:  # the preset fills what was not given
        args.c = args.c or QUICK_CONCURRENCY
        args.max_replays = QUICK_MAX_REPLAYS if args.max_replays is None else args.max_replays
    options = GateOptions(
        profiles=tuple(args.profile),
        concurrency=args.c or (1, 2, 4, 8),
        turns=args.turns,
        out=args.out,
        junit=args.junit,
        strict=args.strict,
        locust_workers=args.locust_workers or 0,
        jobs=args.jobs,
        seed=args.seed,
        report=not args.no_report,
        pushgateway=args.pushgateway,
        grafana_url=args.grafana_url,
        grafana_token=args.grafana_token or os.environ.get(GRAFANA_TOKEN_ENV),
    )
    flags = TargetFlags(
        engine=args.engine,
        target=args.target,
        metrics_url=args.metrics_url,
        gauges=args.gauges,
        extra_gauges=tuple(args.gauge),
        faults=tuple(args.inject),
        model=args.model,
        max_replays=args.max_replays,
        vllm_python=args.vllm_python or os.environ.get(VLLM_PYTHON_ENV) or sys.executable,
        vllm_args=tuple(args.vllm_arg),
        vllm_version=args.vllm_version,
        sglang_version=args.sglang_version,
        sglang_cache=args.sglang_cache,
        page_size=args.page_size,
        lightllm_src=args.lightllm_src,
        lightllm_cache=args.lightllm_cache,
        seed=args.seed,
        engine_sets=tuple(args.engine_set),
    )
    try:
        target = choose(flags, args.out)
        target.selected(options.profiles)
    except ValueError as exc:
        streams.err(f"kvwatch gate: {exc}")
        return 2
    called = []
    if args.target and args.metrics_url:  # any answer to GET TARGET/health shows it is up
        called = [("--target", args.target, f"{args.target.rstrip('/')}/health")]
        called.append(("--metrics-url", args.metrics_url, args.metrics_url))
    return _validated_run(options, lambda opts: run_gate(opts, target), called)


def _validated_run(options, run, called: Sequence[tuple[str, str, str]] = ()) -> int:
    """Exit 2 on options that do not validate; 3 when nothing answers at one of the
    ``called`` addresses, ``(flag, its value, the URL asked)`` (a ``--target`` that
    is down: checked before any load starts, so nothing is written); else run and
    return the run's exit code."""
    try:
        options.validate()
    except ValueError as exc:
        streams.err(f"kvwatch gate: {exc}")
        return 2
    for flag, value, url in called:
        if (why := _unanswered(url)) is not None:
            streams.err(f"kvwatch gate: nothing answers at {value} ({flag}): {why}")
            return 3
    _, code = run(options)
    return code


def _unanswered(url: str) -> str | None:
    """Why no HTTP server answers at ``url`` (refused, no such host, timed out), or
    None when one answers, whatever its status (a 404 too): what it answers is
    the run's to judge.

    The flags are valid by now, so this is the target's state, not the user's
    spelling: exit 3 (the run broke), which a CI job reads as "the server it
    should have started is not up", apart from exit 2 for a wrong command line.
    """
    import httpx

    try:
        httpx.get(url, timeout=TARGET_TIMEOUT_S)
    except httpx.TransportError as exc:
        return re.sub(r"^\[Errno -?\d+\] ", "", str(exc)) or type(exc).__name__
    return None


def _dashboards_build(args: argparse.Namespace) -> int:
    from kvwatch.dashboards import build
    from kvwatch.harness.outputs import directory

    out = args.out or build.COMMITTED
    try:
        directory("--out", out)
        if args.check:
            stale = build.drift(out)
        else:
            written = build.write(out)
    except ValueError as exc:
        streams.err(f"kvwatch dashboards build: {exc}")
        return 2
    except OSError as exc:
        verb = "read" if args.check else "write"
        where = exc.filename or out
        streams.err(f"kvwatch dashboards build: cannot {verb} {where}: {exc.strerror or exc}")
        return 2
    if args.check:
        for name in stale:
            if Path(name).stem not in build.DASHBOARDS:
                how = "has no builder"
            else:
                how = "differs from its builder" if (out / name).exists() else "is missing"
            streams.err(f"kvwatch dashboards build: {out / name} {how}")
        return 1 if stale else 0
    for path in written:
        streams.out(str(path))
    return 0


def _dashboards_push(args: argparse.Namespace) -> int:
    from grafana_client.client import GrafanaException

    from kvwatch.dashboards import build, push

    token = args.token or os.environ.get(GRAFANA_TOKEN_ENV)
    try:
        api = push.connect(args.grafana_url, token)
        result = push.push(api, build.models(), args.prometheus_url, args.folder)
    except (OSError, GrafanaException) as exc:
        streams.err(f"kvwatch dashboards push: {args.grafana_url}: {exc}")
        return 1
    for uid, url in result.dashboards.items():
        streams.out(f"{uid}\t{url}")
    return 0


def _read_config(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read --config {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--config {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"--config {path} must hold a JSON object")
    return data


def _histories(args: argparse.Namespace) -> int:
    from kvwatch.histories.command import (
        HistoryOptions,
        export_replay,
        parse_seeds,
        replay,
        run,
    )

    try:
        if args.export is not None:
            return export_replay(args.replay, args.export)
        if args.replay is not None:
            return replay(args.replay, args.lightllm_src)
        chosen = {
            "sglang": (args.sglang_version, args.sglang_setup),
            "vllm": (args.vllm_version, args.vllm_setup),
            "lightllm": (None, args.lightllm_setup),
        }
        for engine, flags in chosen.items():
            if any(flags) and args.engine != engine:
                raise ValueError(f"--{engine}-* flags go with --engine {engine}")
        version, setup = chosen.get(args.engine, (None, None))
        options = HistoryOptions(
            engine=args.engine,
            version=version,
            setup=setup,
            src=args.lightllm_src,
            seeds=parse_seeds(args.seeds),
            turns=args.turns,
            ops=args.ops,
            turns_apart=args.turns_apart,
            sets=tuple(args.engine_set),
            faults=tuple(args.inject),
            out=args.out,
            shrink_budget=args.shrink_budget,
        )
        return run(options)
    except (ValueError, OSError, RuntimeError) as exc:  # RuntimeError: a release not had here
        streams.err(f"kvwatch histories: {exc}")
        return 3 if isinstance(exc, RuntimeError) else 2


HANDLERS = {
    "faults": _faults,
    "serve": _serve,
    "profiles": _profiles,
    "gate": _gate,
    "histories": _histories,
    "dashboards_build": _dashboards_build,
    "dashboards_push": _dashboards_push,
}


def interruptible() -> None:
    """Ctrl-C (SIGINT) stops kvwatch, however it was started.

    A shell starts a background job (``cmd &`` in a script) with SIGINT
    ignored, and Python then leaves it ignored: ``kill -INT`` would do
    nothing, and the documented exit (a partial summary, 130) would never
    happen. The process entry points put Python's own handler back.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if argv is None:  # the `kvwatch` command or `python -m kvwatch`, not a call from Python
        interruptible()
    try:
        # A reader that leaves (`kvwatch faults | head`, a CI log pipe closed
        # early) loses the lines it did not read, never the exit code: every
        # line goes through `streams`, which drops what a closed pipe cannot take.
        return HANDLERS[args.handler](args)
    finally:
        streams.settle()
