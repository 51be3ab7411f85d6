"""``kvwatch gate --soak DURATION``: continuous agentic load, probed while it runs.

    target.serving(target.soak_profile(PROFILES))   kvwatch: its server, with --inject faults
        served.soak(SoakSpec)                       the load and its probes
                                                    (harness/soak_load.py) -> RunRecord
    detector_set(SOAK_SIGNALS) judges it -> OUT/summary.json, soak/usage.csv, --junit

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
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from kvwatch import streams
from kvwatch.gate.outputs.junit import write_junit
from kvwatch.gate.outputs.soak_report import soak_section, table, write_episodes, write_series
from kvwatch.gate.outputs.summary import GateSummary, summarize, write_summary
from kvwatch.gate.verdicts.detectors import NONE, detector_set
from kvwatch.gate.verdicts.judge import judge
from kvwatch.harness import outputs
from kvwatch.harness.profiles import SOAK_PROFILES
from kvwatch.harness.progress import Progress
from kvwatch.harness.run_record import Counts, RunRecord
from kvwatch.harness.specs import SOAK_SIGNALS, SoakSpec
from kvwatch.harness.target import Target
from kvwatch.processes import ServerError

DETECTORS = detector_set(SOAK_SIGNALS)
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
    profiles: tuple[str, ...] = SOAK_PROFILES  # the target checks them (Target.soak_profile)
    concurrency: int = 4
    out: Path = Path("kvwatch-out")
    junit: Path | None = None
    strict: bool = False  # a notice fails the gate
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

    def spec(self, where: Path) -> SoakSpec:
        return SoakSpec(
            duration=self.duration,
            concurrency=self.concurrency,
            where=where,
            seed=self.seed,
            episode_turns=self.episode_turns,
            interval=self.interval,
            warmup_s=self.warmup_fraction * self.duration,
            stop_timeout=self.stop_timeout,
            drain_timeout=self.drain_timeout,
            progress=self.progress,
        )


def run_soak(opts: SoakOptions, target: Target) -> tuple[GateSummary, int]:
    """Serve, load, probe, drain, judge; the summary and the exit code (0, 1 or 3).
    ValueError for profiles the target cannot soak (a usage error)."""
    opts.validate()
    profile = target.soak_profile(opts.profiles)
    outputs.mark(opts.out)
    started = time.monotonic()
    where = outputs.child(opts.out, "soak")
    where.mkdir(parents=True, exist_ok=True)
    progress = Progress([("soak", opts.concurrency)], opts.progress, tell=opts.result)
    try:
        with target.serving(profile, progress) as served:
            record = served.soak(opts.spec(where))
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
        detectors=DETECTORS if record.error is None else NONE,
    )
    summary = summarize([result], target.faults, target=target.name, strict=opts.strict)
    elapsed = round(time.monotonic() - started, 1)
    section = soak_section(opts, record, result, elapsed)
    summary = replace(summary, elapsed_s=elapsed, soak=section)
    write_series(where / "usage.csv", record)
    write_episodes(where / "episodes.csv", record)
    write_summary(summary, opts.out)
    if opts.junit is not None:
        write_junit(summary, opts.junit)
    opts.result(table(section))
    opts.result(f"verdict: {summary.verdict}{summary.why()} ({summary.elapsed_s} s) -> {opts.out}")
    return summary, summary.exit_code
