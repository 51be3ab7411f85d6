"""``kvwatch gate --soak DURATION``: continuous agentic load, probed while it runs.

    kvwatch serve --enable-probe  (the soak profiles' engine, with --inject faults)
    TurnRecorder over HTTP: baseline probe
    Locust for DURATION at -c users of the soak profiles, running free in episodes
        every few seconds: a probe (a "turn" of the record, at its time into
        the load), which runs between two engine steps, so it must be clean
        even with requests in flight
    time is up: each user ends its turn and closes its sessions (stop timeout)
    TurnRecorder.finish: no request live -> flush the cache -> drained probe
    the same detectors as a turn run -> OUT/summary.json, soak/usage.csv, --junit

It is the gate over a time-indexed record: one ``RunRecord`` (with ``soak``
timing and the users' request counts), judged by ``allocator`` (findings,
bounds, usage over whole episodes, drain), ``refcount``, ``tree``,
``slot-table`` and ``requests``. Exit codes are the gate's: 0 every detector
passed, 1 one failed, 3 the soak broke (the engine died, no request was
served, the probe stopped answering): a soak that could not watch its engine
is never a pass.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import requests

from kvwatch import streams
from kvwatch.gate import outputs
from kvwatch.gate import profiles as catalog
from kvwatch.gate.console import Progress
from kvwatch.gate.detectors import for_signals
from kvwatch.gate.judge import judge, no_service
from kvwatch.gate.junit import write_junit
from kvwatch.gate.locust_run import locust_commands
from kvwatch.gate.plan import ProbeSpec, RunPlan
from kvwatch.gate.profiles import Profile, engine_for
from kvwatch.gate.recorder import RecorderOptions, TurnRecorder
from kvwatch.gate.run_record import Counts, RunRecord, Signal, Soak
from kvwatch.gate.soak_report import soak_section, table, write_episodes, write_series
from kvwatch.gate.sources import HttpSource
from kvwatch.gate.summary import GateSummary, summarize, write_summary
from kvwatch.processes import ServerError, stop

if TYPE_CHECKING:
    from kvwatch.targets.kvwatch_serve import EngineServer
    from kvwatch.targets.kvwatch_target import KvwatchTarget

SOAK_PROFILES = ("agentic-trie", "streaming-session")
# What a soak's record carries: probes (with the slot table and every registry's
# size) and the users' request counts; no heap samples, replays or gauges.
SIGNALS = frozenset({Signal.PROBES, Signal.SLOTS, Signal.REGISTRIES, Signal.REQUESTS})
DETECTORS = for_signals(SIGNALS)
MIN_SOAK_S, MAX_SOAK_S = 5.0, 7 * 24 * 3600.0
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


@dataclass(frozen=True, kw_only=True)
class SoakOptions:
    duration: float  # seconds of load
    profiles: tuple[str, ...] = SOAK_PROFILES
    concurrency: int = 4
    out: Path = Path("kvwatch-out")
    junit: Path | None = None
    seed: int = 0
    episode_turns: int = 6  # turns before a user closes its conversations and starts anew
    probe_every: float = 0.0  # seconds; 0: duration / 60, within 0.5 .. 2
    warmup_fraction: float = 0.2  # of the duration, left out of the usage trend
    stop_timeout: float = 60.0
    drain_timeout: float = 120.0
    progress: Callable[[str], None] = field(default=streams.err)  # what it is doing
    result: Callable[[str], None] = field(default=streams.out)  # the table, the verdict

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
        outputs.out_dir(self.out)
        if self.junit is not None:
            outputs.report_file("--junit", self.junit, self.out)

    @property
    def interval(self) -> float:
        return self.probe_every or min(2.0, max(0.5, self.duration / 60))


def run_soak(opts: SoakOptions, target: KvwatchTarget) -> tuple[GateSummary, int]:
    """Serve, load, probe, drain, judge; the summary and the exit code (0, 1 or 3)."""
    opts.validate()
    outputs.mark(opts.out)
    started = time.monotonic()
    where = outputs.child(opts.out, "soak")
    where.mkdir(parents=True, exist_ok=True)
    progress = Progress([("soak", opts.concurrency)], opts.progress, tell=opts.result)
    try:
        with target.serving(soak_profile(opts.profiles), progress) as served:
            record = SoakLoad(opts, served.server, where, target.model).record()
    except ServerError as exc:
        record = RunRecord(turns=(), error=str(exc))
    (where / "record.json").write_text(json.dumps(record.to_json()))
    sent = record.requests or Counts(status={}, failed=0, broken_turns=0)
    result = judge(
        "soak",
        opts.concurrency,
        record,
        requests=sent.requests,
        errors=sent.errors,
        detectors=DETECTORS if record.error is None else (),
    )
    summary = summarize([result], target.faults, target=target.name)
    elapsed = round(time.monotonic() - started, 1)
    section = soak_section(opts, record, result, elapsed)
    summary = replace(summary, elapsed_s=elapsed, soak=section)
    write_series(where / "usage.csv", record)
    write_episodes(where / "episodes.csv", record)
    write_summary(summary, opts.out)
    if opts.junit is not None:
        write_junit(summary, opts.junit)
    opts.result(table(section))
    opts.result(f"verdict: {summary.verdict} ({summary.elapsed_s} s) -> {opts.out}")
    return summary, summary.exit_code


def soak_profile(names: tuple[str, ...]) -> Profile:
    """One server for the soak's profiles side by side: their engine overrides merged."""
    users = " and ".join(catalog.get(n).user for n in names)
    return Profile(
        name="soak", user=users, summary=f"{users}, free-running", engine=engine_for(names)
    )


class SoakLoad:
    """One soak against a running server: Locust runs free while a recorder probes."""

    def __init__(self, opts: SoakOptions, server: EngineServer, where: Path, model: str) -> None:
        self.opts, self.server, self.where, self.model = opts, server, where, model
        self.begun = time.monotonic()
        source = HttpSource(server.url, white_box=True, token=server.token)
        self.recorder = TurnRecorder(
            source,
            # nothing replays a soak's requests: the recorder does not collect them
            RecorderOptions(watch=True, drain_timeout=opts.drain_timeout, replays=False),
            clock=lambda: round(time.monotonic() - self.begun, 3),
        )
        self.probe_errors: list[str] = []

    def record(self) -> RunRecord:
        rec = self.recorder
        try:
            rec.start()
        except requests.RequestException as exc:
            rec.broke(f"the baseline probe failed: {exc!r}")
            return rec.record()
        status, load_s = self._load()
        sent = Counts.from_json(status)
        rec.requests = sent
        rec.soak = Soak(
            duration_s=self.opts.duration,
            warmup_s=self.opts.warmup_fraction * self.opts.duration,
            users=self.opts.concurrency,
            episode_ends=tuple(
                (user, round(at - self.begun_wall, 3))
                for user, at in status.get("episode_ends", ())
            ),
            load_s=round(load_s, 1),
            probe_errors=len(self.probe_errors),
        )
        if self.probe_errors:
            rec.broke(f"{len(self.probe_errors)} probes failed; first {self.probe_errors[0]}")
        if dead := no_service(sent.requests, sent.errors):
            rec.broke(dead)
        if rec.error is None:
            try:
                rec.finish()
            except requests.RequestException as exc:
                rec.broke(f"the drain failed: {exc!r}")
        if gone := self.server.exited():  # a dead engine outranks everything it left behind
            rec.error = gone
        return rec.record()

    def _load(self) -> tuple[dict, float]:
        """Locust for the duration, a probe every interval; the users' status counts."""
        opts, where = self.opts, self.where
        status_file = where / "status.json"
        status_file.unlink(missing_ok=True)
        plan = RunPlan(
            profile="soak",
            concurrency=opts.concurrency,
            target=self.server.url,
            record=str(status_file),
            turns=opts.episode_turns,
            seed=opts.seed,
            source=ProbeSpec(white_box=True, token=self.server.token),
            test_controls=True,
            model=self.model,
            soak=True,
        )
        (where / "plan.json").write_text(plan.to_json())
        users = tuple(catalog.get(p).user for p in opts.profiles)
        (cmd,) = locust_commands(
            users,
            opts.concurrency,
            self.server.url,
            where / "plan.json",
            where,
            0,
            opts.duration,
            stop_timeout=opts.stop_timeout,
        )
        with (where / "locust.log").open("w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            self.begun, self.begun_wall = time.monotonic(), time.time()
            try:
                self._watch(proc)
            finally:
                stop(proc, grace=5)
        load_s = time.monotonic() - self.begun
        if self.recorder.error is None and proc.returncode != 0:
            self.recorder.broke(
                f"locust exited with {proc.returncode} (see {where / 'locust.log'})"
            )
        status = json.loads(status_file.read_text()) if status_file.exists() else {}
        return status, load_s

    def _watch(self, proc: subprocess.Popen) -> None:
        """Probe every interval until Locust exits (or the server dies, or it overruns)."""
        opts = self.opts
        deadline = self.begun + opts.duration + opts.stop_timeout + 60
        next_probe, note_every = self.begun, max(5.0, opts.duration / 10)
        next_note = self.begun + note_every
        while proc.poll() is None:
            now = time.monotonic()
            if gone := self.server.exited():
                self.recorder.broke(gone)
                return
            if now > deadline:
                self.recorder.broke(
                    f"Locust did not stop {opts.stop_timeout:.0f} s after the soak ended"
                )
                return
            if now >= next_probe:
                try:
                    self.recorder.barrier(len(self.recorder.turns), (), drain=False)
                except requests.RequestException as exc:
                    self.probe_errors.append(f"at {now - self.begun:.1f} s: {exc!r}")
                # every interval; a probe slower than that leaves the engine half of one
                next_probe = max(next_probe + opts.interval, time.monotonic() + opts.interval / 2)
            if now >= next_note:
                next_note += note_every
                opts.progress(self._note(now - self.begun))
            time.sleep(0.05)

    def _note(self, at: float) -> str:
        turns = self.recorder.turns
        if not turns:
            return f"    soak {at:.0f}/{self.opts.duration:.0f} s: no probe yet"
        last = turns[-1].barrier
        pinned = ", ".join(f"{g} {b.pinned}" for g, b in last.bounds.items())
        hits = sum(len(t.barrier.findings) for t in turns)
        return (
            f"    soak {at:.0f}/{self.opts.duration:.0f} s: {len(turns)} probes, {hits} findings, "
            f"{last.live_requests} live requests, pinned {pinned}"
        )
