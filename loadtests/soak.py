"""``kvwatch gate --soak DURATION``: continuous agentic load, probed while it runs.

    kvwatch serve --enable-probe  (the soak profiles' engine, with --inject faults)
    baseline probe
    Locust for DURATION at -c users of the soak profiles, running free in episodes
        every few seconds: GET /debug/probe, which runs between two engine
        steps, so it must be clean even with requests in flight
    time is up: each user ends its turn and closes its sessions (stop timeout)
    drain: no request live -> flush the cache -> drained probe
    soak_judge.py -> OUT/summary.json {"soak": ...}, OUT/soak/usage.csv, --junit

Exit codes are the gate's: 0 every check passed, 1 a check failed, 3 the
soak broke (the engine died, no request was served, the probe stopped
answering): a soak that could not watch its engine is never a pass.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import httpx

from kvwatch.contracts import ProbeReport
from kvwatch.engine.faults import parse_faults
from kvwatch.instrumentation import gate as verdicts
from kvwatch.instrumentation.record import Counts
from kvwatch.loadtests import outputs
from kvwatch.loadtests import profiles as catalog
from kvwatch.loadtests import soak_judge as judge
from kvwatch.loadtests.gate import no_service
from kvwatch.loadtests.plan import RunPlan
from kvwatch.loadtests.servers import EngineServer, ServerError, locust_commands, stop

SOAK_PROFILES = ("agentic-trie", "streaming-session")
MIN_SOAK_S, MAX_SOAK_S = 5.0, 7 * 24 * 3600.0
PROBE_TIMEOUT = 30.0
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smh]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600}


def parse_duration(text: str) -> float:
    """``600``, ``90s``, ``10m``, ``1.5h`` -> seconds; ValueError otherwise."""
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None:
        raise ValueError(f"--soak takes a duration like 600, 90s or 10m, not {text!r}")
    seconds = float(match[1]) * _UNITS[match[2]]
    if not MIN_SOAK_S <= seconds <= MAX_SOAK_S:
        raise ValueError(f"--soak must last {MIN_SOAK_S:.0f} s to 7 days, not {text!r}")
    return seconds


@dataclass(frozen=True)
class SoakOptions:
    duration: float  # seconds of load
    profiles: tuple[str, ...] = SOAK_PROFILES
    concurrency: int = 4
    faults: tuple[str, ...] = ()
    out: Path = Path("kvwatch-out")
    junit: Path | None = None
    seed: int = 0
    model: str = "kvwatch-tiny-hybrid"
    episode_turns: int = 6  # turns before a user closes its conversations and starts anew
    probe_every: float = 0.0  # seconds; 0: duration / 60, within 0.5 .. 2
    warmup_fraction: float = 0.2  # of the duration, left out of the usage trend
    stop_timeout: float = 60.0
    drain_timeout: float = 120.0
    progress: Callable[[str], None] = field(default=lambda line: print(line, file=sys.stderr))

    def validate(self) -> None:
        """Usage errors (the CLI's exit 2) as ValueError."""
        for name in self.profiles:
            catalog.get(name)
            if name not in SOAK_PROFILES:
                raise ValueError(f"--soak runs {' and '.join(SOAK_PROFILES)}, not {name!r}")
        if not MIN_SOAK_S <= self.duration <= MAX_SOAK_S:
            raise ValueError(f"--soak must last {MIN_SOAK_S:.0f} s to 7 days")
        if not 1 <= self.concurrency <= 64:
            raise ValueError("-c takes one concurrency in 1..64 with --soak, e.g. -c 4")
        parse_faults(self.faults)
        outputs.out_dir(self.out)
        if self.junit is not None:
            outputs.report_file("--junit", self.junit, self.out)

    @property
    def interval(self) -> float:
        return self.probe_every or min(2.0, max(0.5, self.duration / 60))


class SoakRecord(NamedTuple):
    baseline: ProbeReport | None = None
    samples: tuple[judge.Sample, ...] = ()
    drained: ProbeReport | None = None
    status: dict | None = None  # answers by status class
    first_5xx: tuple[dict, ...] = ()
    requests: int = 0
    errors: int = 0
    probe_errors: tuple[str, ...] = ()
    episode_ends: tuple[tuple[int, float], ...] = ()  # (user, seconds since the load began)
    load_s: float = 0.0
    error: str | None = None


def run_soak(opts: SoakOptions) -> tuple[dict, int]:
    """Serve, load, probe, drain, judge; the summary and the exit code (0, 1 or 3)."""
    opts.validate()
    outputs.mark(opts.out)
    started = time.monotonic()
    where = outputs.child(opts.out, "soak")
    where.mkdir(parents=True, exist_ok=True)
    try:
        server = _start_server(opts)
    except ServerError as exc:
        record = SoakRecord(error=str(exc))
    else:
        try:
            record = _record(opts, server, where)
        finally:
            server.stop()
    summary = summarize(opts, record, time.monotonic() - started)
    _write_series(where / "usage.csv", record.samples)
    _write_episodes(where / "episodes.csv", record.episode_ends)
    verdicts.write(summary, opts.out, opts.junit)
    print(table(summary["soak"]))
    opts.progress(f"verdict: {summary['verdict']} ({summary['elapsed_s']} s) -> {opts.out}")
    return summary, verdicts.exit_code(summary)


def _start_server(opts: SoakOptions) -> EngineServer:
    where = outputs.child(opts.out, "servers", "soak")
    where.mkdir(parents=True, exist_ok=True)
    config = where / "engine.json"
    config.write_text(json.dumps(catalog.engine_for(opts.profiles), indent=2))
    spans = outputs.child(opts.out, "spans", "soak")
    return EngineServer(config, opts.faults, where / "server.log", spans)


def _record(opts: SoakOptions, server: EngineServer, where: Path) -> SoakRecord:
    auth = {"Authorization": f"Bearer {server.token}"}
    with httpx.Client(base_url=server.url, headers=auth, timeout=PROBE_TIMEOUT) as http:
        try:
            baseline = _probe(http)
        except httpx.HTTPError as exc:
            return SoakRecord(error=f"the baseline probe failed: {exc!r}")
        record = _load(opts, server, http, where)._replace(baseline=baseline)
        if record.error is None:
            try:
                record = record._replace(drained=_drain(http, opts.drain_timeout))
            except httpx.HTTPError as exc:
                record = record._replace(error=f"the drain failed: {exc!r}")
        if gone := server.exited():  # a dead engine outranks everything it left behind
            record = record._replace(error=gone)
    return record


def _load(opts: SoakOptions, server: EngineServer, http: httpx.Client, where: Path) -> SoakRecord:
    status_file = where / "status.json"
    status_file.unlink(missing_ok=True)
    plan = RunPlan(
        profile="soak",
        concurrency=opts.concurrency,
        target=server.url,
        record=str(status_file),
        turns=opts.episode_turns,
        seed=opts.seed,
        probe_token=server.token,
        model=opts.model,
        soak=True,
    )
    (where / "plan.json").write_text(plan.to_json())
    users = tuple(catalog.get(p).user for p in opts.profiles)
    (cmd,) = locust_commands(
        users,
        opts.concurrency,
        server.url,
        where / "plan.json",
        where,
        0,
        opts.duration,
        stop_timeout=opts.stop_timeout,
    )
    samples, failed, error = [], [], None
    with (where / "locust.log").open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        begun, begun_wall = time.monotonic(), time.time()
        deadline = begun + opts.duration + opts.stop_timeout + 60
        next_probe, next_note = begun, begun + max(5.0, opts.duration / 10)
        try:
            while proc.poll() is None:
                now = time.monotonic()
                if gone := server.exited():
                    error = gone
                    break
                if now > deadline:
                    error = f"Locust did not stop {opts.stop_timeout:.0f} s after the soak ended"
                    break
                if now >= next_probe:
                    try:
                        samples.append(judge.sample(_probe(http), now - begun))
                    except httpx.HTTPError as exc:
                        failed.append(f"at {now - begun:.1f} s: {exc!r}")
                    # every interval; a probe slower than that leaves the engine half of one
                    next_probe = max(
                        next_probe + opts.interval, time.monotonic() + opts.interval / 2
                    )
                if now >= next_note:
                    next_note += max(5.0, opts.duration / 10)
                    opts.progress(_note(now - begun, opts.duration, samples))
                time.sleep(0.05)
        finally:
            stop(proc, grace=5)
    load_s = time.monotonic() - begun
    status = json.loads(status_file.read_text()) if status_file.exists() else {}
    sent = Counts.from_json(status)
    requests, errors = sent.requests, sent.errors
    if error is None and proc.returncode != 0:
        error = f"locust exited with {proc.returncode} (see {where / 'locust.log'})"
    if error is None and failed:
        error = f"{len(failed)} probes failed; first {failed[0]}"
    if error is None:
        error = no_service(requests, errors)
    return SoakRecord(
        samples=tuple(samples),
        status=sent.status,
        first_5xx=sent.first_5xx,
        requests=requests,
        errors=errors,
        probe_errors=tuple(failed),
        episode_ends=tuple((user, at - begun_wall) for user, at in status.get("episode_ends", ())),
        load_s=load_s,
        error=error,
    )


def _probe(http: httpx.Client) -> ProbeReport:
    resp = http.get("/debug/probe")
    resp.raise_for_status()
    return ProbeReport.from_json(resp.json())


def _drain(http: httpx.Client, timeout: float) -> ProbeReport:
    """The probe once nothing runs and the cache is flushed; if the engine never
    gets idle, its last probe (live requests show, and the drain check fails)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        report = _probe(http)
        if report.live_requests == 0:
            resp = http.post("/debug/flush_cache")
            if resp.status_code != 409:  # 409: a request arrived late; wait again
                resp.raise_for_status()
                return _probe(http)
        time.sleep(0.1)
    return _probe(http)


def _note(at: float, duration: float, samples: list[judge.Sample]) -> str:
    if not samples:
        return f"    soak {at:.0f}/{duration:.0f} s: no probe yet"
    last = samples[-1]
    pinned = ", ".join(f"{g} {v}" for g, v in last.pinned.items())
    hits = sum(len(s.findings) for s in samples)
    return (
        f"    soak {at:.0f}/{duration:.0f} s: {len(samples)} probes, {hits} findings, "
        f"{last.live_requests} live requests, pinned {pinned}"
    )


def summarize(opts: SoakOptions, record: SoakRecord, wall: float) -> dict:
    """The gate's summary shape (verdict, faults, detectors, runs) plus ``soak``."""
    loaded = [s for s in record.samples if s.t <= opts.duration]
    warmup = opts.warmup_fraction * opts.duration
    groups = record.baseline.groups if record.baseline else {}
    trends = [
        judge.usage_trend(
            g,
            v.capacity,
            [s.t for s in loaded],
            [s.pinned[g] for s in loaded],
            warmup,
            opts.concurrency,
            record.episode_ends,
        )
        for g, v in groups.items()
    ]
    checks = []
    if record.baseline is not None:
        checks = [
            judge.check_5xx(record.status or {}, record.first_5xx),
            judge.check_findings(record.samples, record.drained),
            judge.check_usage(trends),
            judge.check_drain(record.baseline, record.drained),
        ]
    verdict = judge.verdict(checks, record.error)
    usage = {}
    for t in trends:
        used = [s.used[t.group] for s in record.samples]
        drained = record.drained.groups[t.group].used if record.drained else None
        usage[t.group] = {
            **t.as_dict(),
            "used_min": min(used, default=0),
            "used_max": max(used, default=0),
            "baseline_used": record.baseline.groups[t.group].used,
            "drained_used": drained,
        }
    soak = {
        "verdict": verdict,
        "error": record.error,
        "profiles": list(opts.profiles),
        "concurrency": opts.concurrency,
        "duration_s": opts.duration,
        "load_s": round(record.load_s, 1),
        "wall_s": round(wall, 1),
        "probe_every_s": opts.interval,
        "requests": record.requests,
        "errors": record.errors,
        "http_5xx": (record.status or {}).get("5xx", 0),
        "http_status": record.status or {},
        "probes": len(record.samples),
        "busy_probes": sum(s.live_requests > 0 for s in record.samples),
        "probe_errors": len(record.probe_errors),
        "episodes": len(record.episode_ends),
        "findings": sum(len(s.findings) for s in record.samples)
        + len(judge.findings(record.drained) if record.drained else ()),
        "checks": {c.name: c.as_dict() for c in checks},
        "usage": usage,
        "series": "soak/usage.csv",
    }
    return {
        "verdict": verdict,
        "faults": sorted(opts.faults),
        "detectors": {},
        "runs": [],
        "soak": soak,
        "elapsed_s": round(wall, 1),
    }


def _write_series(path: Path, samples: tuple[judge.Sample, ...]) -> None:
    """One row per probe: time, live work, findings, and per group used, pinned, by owner."""
    if not samples:
        return
    groups = list(samples[0].used)
    owners = {g: list(samples[0].by_owner[g]) for g in groups}
    head = ["t_s", "live_requests", "live_sessions", "findings"]
    for g in groups:
        head += [f"{g}.used", f"{g}.pinned", *(f"{g}.{o}" for o in owners[g])]
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(head)
        for s in samples:
            row = [s.t, s.live_requests, s.live_sessions, len(s.findings)]
            for g in groups:
                row += [s.used[g], s.pinned[g], *(s.by_owner[g].get(o, 0) for o in owners[g])]
            out.writerow(row)


def _write_episodes(path: Path, ends: tuple[tuple[int, float], ...]) -> None:
    """One row per episode a user ended: the user and the time, in seconds of the soak."""
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["user", "t_s"])
        out.writerows((user, round(t, 3)) for user, t in sorted(ends, key=lambda e: e[1]))


def table(soak: dict) -> str:
    """The soak's figures as a short text table."""
    lines = [
        f"soak: {soak['verdict']}  {soak['duration_s']:.0f} s of load at c={soak['concurrency']} "
        f"({', '.join(soak['profiles'])}), {soak['wall_s']} s wall",
        f"requests {soak['requests']}, errors {soak['errors']}, 5xx {soak['http_5xx']}; "
        f"probes {soak['probes']} ({soak['busy_probes']} busy), findings {soak['findings']}",
    ]
    if soak["usage"]:
        lines.append(
            f"{'group':<13}{'capacity':>9}{'pinned':>11}{'used':>11}{'slope/min':>11}"
            f"{'p':>8}{'baseline':>9}{'drained':>8}"
        )
        for g, u in soak["usage"].items():
            lines.append(
                f"{g:<13}{u['capacity']:>9}{u['pinned_min']:>5}..{u['pinned_max']:<4}"
                f"{u['used_min']:>5}..{u['used_max']:<4}{u['slope_per_min']:>+11.2f}"
                f"{u['p_value']:>8.3f}{u['baseline_used']:>9}{u['drained_used']!s:>8}"
            )
    lines += [f"{name:<18} {c['verdict']:<5} {c['evidence']}" for name, c in soak["checks"].items()]
    if soak["error"]:
        lines.append(f"error: {soak['error']}")
    return "\n".join(lines)
