"""vLLM's own scheduler as a gate target, in process: ``--engine vllm-scheduler``.

Some of vLLM's bugs are reached only from inside its engine core: a
streaming-input session (``AsyncLLM``'s input generator, no HTTP route), the
schedule of two steps in flight that GPUs run by default, per-step state of
the KV managers. This target runs the loads that reach them
(``vllm_workloads.py``) through vLLM's own ``Scheduler`` with no model, in
vLLM's Python: each run is one ``vllm_sched_driver.py`` process of the
release ``--vllm-version`` names (``vllm_release.py``: a venv of its own, or
its wheel unpacked over ``--vllm-python``'s packages, which is how 0.25.1 and
0.26.0 run beside torch 2.13)::

    run(spec): OUT/runs/P-cN/scheduler-plan.json
               python -P -m kvwatch.targets.vllm.scheduler_driver PLAN   (PYTHONPATH: the release)
                   turns of the workload; the audit, the checks and the registry sizes
                   at each barrier and at the steps that showed a new rule
               -> scheduler-record.json (GET /audit answers) -> RunRecord

Its records carry probes (``vllm_source.probe_report`` reads each answer as
the white-box vLLM target reads its engine core's), registries (the KV
managers' container sizes) and request counts, so ``allocator``,
``refcount``, ``tree``, ``quiescence`` and ``requests`` judge it; there are
no gauges, heap samples or replays.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import ClassVar, NamedTuple

from kvwatch.harness import outputs
from kvwatch.harness.progress import Progress, turn_line
from kvwatch.harness.run_record import Counts, RunRecord, Signal, Turn
from kvwatch.harness.target import RunSpec, Served, Target
from kvwatch.processes import stop
from kvwatch.targets.vllm.probe_source import probe_report
from kvwatch.targets.vllm.release import Release
from kvwatch.targets.vllm.workloads import WORKLOADS

DRIVER = "kvwatch.targets.vllm.scheduler_driver"
PLAN, RECORD, PROGRESS = "scheduler-plan.json", "scheduler-record.json", "scheduler-progress.jsonl"


class SchedulerProfile(NamedTuple):
    name: str
    summary: str
    turns: int = 6


PROFILES = {name: SchedulerProfile(name, w.summary) for name, w in WORKLOADS.items()}


class VllmSchedulerTarget(Target):
    name: ClassVar[str] = "vllm-scheduler"
    signals = frozenset({Signal.PROBES, Signal.REGISTRIES, Signal.REQUESTS})

    def __init__(self, out: Path, release: Release) -> None:
        self.out, self.release = out, release

    def profiles(self) -> Mapping[str, SchedulerProfile]:
        return PROFILES

    @contextlib.contextmanager
    def started(self, progress: Progress) -> Iterator[None]:
        over = f" over {self.release.python}" if self.release.pythonpath else ""
        where = self.release.pythonpath or self.release.python
        progress.say(f"vLLM {self.release.version}'s scheduler in process, from {where}{over}")
        yield

    @contextlib.contextmanager
    def serving(self, profile: SchedulerProfile, progress: Progress) -> Iterator[Served]:
        yield SchedulerServed(self.release, profile)


class SchedulerServed(Served):
    """Each run a driver process of its own: no state is shared between runs."""

    def __init__(self, release: Release, profile: SchedulerProfile) -> None:
        self.release, self.profile = release, profile

    def run(self, spec: RunSpec) -> RunRecord:
        where = spec.where
        paths = {name: outputs.child(where, name) for name in (PLAN, RECORD, PROGRESS)}
        for path in paths.values():
            path.unlink(missing_ok=True)
        plan = {
            "profile": self.profile.name,
            "concurrency": spec.concurrency,
            "turns": spec.turns,
            "warmup": spec.warmup,
            "seed": spec.seed,
            "record": str(paths[RECORD].absolute()),
            "progress": str(paths[PROGRESS].absolute()),
            "model": str(outputs.child(where, "model").absolute()),
        }
        paths[PLAN].write_text(json.dumps(plan))
        error = self._drive(paths[PLAN], paths[PROGRESS], spec)
        if error is None and not paths[RECORD].exists():
            error = f"the driver ended without a record (see {where / 'scheduler.log'})"
        if error is not None:
            return RunRecord(turns=(), error=error)
        return to_record(json.loads(paths[RECORD].read_text()), spec.warmup)

    def _drive(self, plan: Path, progress_file: Path, spec: RunSpec) -> str | None:
        """The driver to its end, its barriers printed as they come; why it broke, or None."""
        env = {**os.environ, **self.release.env(), "VLLM_LOGGING_LEVEL": "WARNING"}
        cmd = [self.release.python, "-P", "-m", DRIVER, str(plan.absolute())]
        seen, deadline = 0, time.monotonic() + spec.run_timeout
        with outputs.child(spec.where, "scheduler.log").open("w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            try:
                while proc.poll() is None:
                    if time.monotonic() > deadline:
                        return f"the scheduler run did not finish in {spec.run_timeout:.0f} s"
                    seen = _follow(spec.progress, progress_file, seen, spec.turns)
                    spec.progress.heartbeat(f"vLLM's scheduler: turn {seen} of {spec.turns}")
                    time.sleep(0.2)
                _follow(spec.progress, progress_file, seen, spec.turns)
            finally:
                stop(proc, grace=5)
        if proc.returncode != 0:
            return f"the driver exited with {proc.returncode} (see {spec.where / 'scheduler.log'})"
        return None


def _follow(progress: Progress, lines: Path, seen: int, turns: int) -> int:
    if not lines.exists():
        return seen
    done = lines.read_text().splitlines()
    for line in done[seen:]:
        progress.say(f"    {turn_line(json.loads(line), turns)}")
    return len(done)


def to_record(data: dict, warmup: int) -> RunRecord:
    """The driver's JSON (``GET /audit`` answers per turn) as the gate's ``RunRecord``."""
    turns = tuple(
        Turn(
            turn=t["turn"],
            probes=tuple(probe_report(a) for a in t["probes"]),
            conversations=t["conversations"],
            context_tokens=t["context_tokens"],
            at=t.get("at"),
            requests=Counts.from_json(t.get("requests")),
        )
        for t in data.get("turns", ())
    )
    error = data.get("error")
    if error:
        error = f"vLLM {data.get('vllm', '?')}'s scheduler run broke: {error}"
    return RunRecord(
        turns=turns,
        warmup=warmup,
        baseline=probe_report(data["baseline"]) if data.get("baseline") else None,
        drained=probe_report(data["drained"]) if data.get("drained") else None,
        error=error,
        requests=Counts.from_json(data["requests"]) if data.get("requests") else None,
    )
