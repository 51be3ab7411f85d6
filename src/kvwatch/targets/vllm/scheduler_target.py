"""vLLM's own scheduler as a gate target, in process: ``--engine vllm-scheduler``.

Some of vLLM's bugs are reached only from inside its engine core: a
streaming-input session (``AsyncLLM``'s input generator, no HTTP route), the
schedule of two steps in flight that GPUs run by default, per-step state of
the KV managers. This target runs the loads that reach them
(``workloads.py``) through vLLM's own ``Scheduler`` with no model, in
vLLM's Python: each run is one ``run_driver.py`` process of the
release ``--vllm-version`` names (``release.py``: a venv of its own, or
its wheel unpacked over ``--vllm-python``'s packages, which is how 0.25.1 and
0.26.0 run beside torch 2.13)::

    run(spec): OUT/runs/P-cN/scheduler-plan.json
               python -P -m kvwatch.targets.vllm.run_driver PLAN   (PYTHONPATH: the release)
                   turns of the workload; the audit, the checks and the registry sizes
                   at each barrier and at the steps that showed a new rule
               -> scheduler-record.json (GET /audit answers) -> RunRecord

Its records carry probes (``probe.probe_report`` reads each answer as
the white-box vLLM target reads its engine core's), registries (the KV
managers' container sizes) and request counts, so ``allocator``,
``refcount``, ``tree``, ``quiescence`` and ``requests`` judge it; there are
no gauges, heap samples or replays.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import ClassVar, NamedTuple

from kvwatch.harness import outputs
from kvwatch.harness.progress import Progress, turn_line
from kvwatch.harness.run_record import Counts, RunRecord, Signal, Turn
from kvwatch.harness.target import RunSpec, Served, Target
from kvwatch.targets.driver import process
from kvwatch.targets.driver.process import Driver, DriverFiles
from kvwatch.targets.vllm.probe import probe_report
from kvwatch.targets.vllm.release import Release
from kvwatch.targets.vllm.sched_profiles import WORKLOADS

DRIVER = "kvwatch.targets.vllm.run_driver"
FILES = DriverFiles(
    plan="scheduler-plan.json",
    record="scheduler-record.json",
    progress="scheduler-progress.jsonl",
    log="scheduler.log",
)


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

    def plan(self, spec: RunSpec) -> dict:
        return {
            "profile": self.profile.name,
            "concurrency": spec.concurrency,
            "turns": spec.turns,
            "warmup": spec.warmup,
            "seed": spec.seed,
            "model": str(outputs.child(spec.where, "model").absolute()),
        }

    def driver(self, spec: RunSpec) -> Driver:
        return Driver(
            command=(self.release.python, "-P", "-m", DRIVER),
            env={**os.environ, **self.release.env(), "VLLM_LOGGING_LEVEL": "WARNING"},
            files=FILES,
            run_name="the scheduler run",
            driver_name="the driver",
            line=lambda line: f"    {turn_line(json.loads(line), spec.turns)}",
            heartbeat=lambda seen: f"vLLM's scheduler: turn {seen} of {spec.turns}",
            poll_s=0.2,
        )

    def run(self, spec: RunSpec) -> RunRecord:
        """The driver's barriers printed as they come; its record read back."""
        plan, driver = self.plan(spec), self.driver(spec)
        return process.run(driver, spec, plan, lambda data: to_record(data, spec.warmup))


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
