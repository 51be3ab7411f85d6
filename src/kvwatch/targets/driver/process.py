"""A run in a driver process of its own: the plan written, the process followed, the record read.

The targets that run an engine's code in a process per run
(``lightllm/target.py``, ``vllm/scheduler_target.py``) share this::

    run(driver, spec, plan, read)
        RUN_DIR/<plan>     the target's plan, with the record's and the progress file's paths
        <command> PLAN     stdout and stderr to RUN_DIR/<log>; its progress lines relayed
                           as they come, a heartbeat between them; killed past
                           spec.run_timeout
        RUN_DIR/<record>   read back as the gate's RunRecord (``read``)

What differs between targets is in its ``Driver``: the command and its
environment, the files' names, how a progress line and the heartbeat read,
and what the errors call the run and the driver.

Invariant: the driver process never outlives ``run``; a run that broke
(past its timeout, a non-zero exit, no record) is a ``RunRecord`` with its
error, naming the log.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

from kvwatch.harness import outputs
from kvwatch.harness.run_record import RunRecord
from kvwatch.harness.target import RunSpec
from kvwatch.processes import stop


class DriverFiles(NamedTuple):
    plan: str
    record: str
    progress: str
    log: str


class Driver(NamedTuple):
    """How a target starts its driver and follows it."""

    command: tuple[str, ...]  # the plan's path goes last
    env: Mapping[str, str]  # the process's whole environment
    files: DriverFiles  # names in the run's folder
    run_name: str  # "the LightLLM run": what did not finish in time
    driver_name: str  # "the LightLLM driver": what exited with an error
    line: Callable[[str], str]  # a progress line as the gate says it
    heartbeat: Callable[[int], str]  # the heartbeat, after so many progress lines
    poll_s: float


def run(driver: Driver, spec: RunSpec, plan: dict, read: Callable[[dict], RunRecord]) -> RunRecord:
    """One run through ``driver``: ``plan`` (with the record's and the progress
    file's paths added) in, the driver's record read back by ``read``."""
    files = driver.files
    paths = {name: outputs.child(spec.where, name) for name in files[:3]}
    for path in paths.values():
        path.unlink(missing_ok=True)
    record = paths[files.record]
    plan = {
        **plan,
        "record": str(record.absolute()),
        "progress": str(paths[files.progress].absolute()),
    }
    paths[files.plan].write_text(json.dumps(plan))
    error = _drive(driver, paths[files.plan], paths[files.progress], spec)
    if error is None and not record.exists():
        error = f"the driver ended without a record (see {spec.where / files.log})"
    if error is not None:
        return RunRecord(turns=(), error=error)
    return read(json.loads(record.read_text()))


def _drive(driver: Driver, plan: Path, progress: Path, spec: RunSpec) -> str | None:
    """The driver to its end, its progress lines relayed; why it broke, or None."""
    cmd = [*driver.command, str(plan.absolute())]
    seen, deadline = 0, time.monotonic() + spec.run_timeout
    with outputs.child(spec.where, driver.files.log).open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(driver.env))
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    return f"{driver.run_name} did not finish in {spec.run_timeout:.0f} s"
                seen = _relay(driver, spec, progress, seen)
                spec.progress.heartbeat(driver.heartbeat(seen))
                time.sleep(driver.poll_s)
            _relay(driver, spec, progress, seen)
        finally:
            stop(proc, grace=5)
    if proc.returncode != 0:
        log_path = spec.where / driver.files.log
        return f"{driver.driver_name} exited with {proc.returncode} (see {log_path})"
    return None


def _relay(driver: Driver, spec: RunSpec, lines: Path, seen: int) -> int:
    """The progress lines the driver wrote since ``seen``, said; how many there are now."""
    if not lines.exists():
        return seen
    done = lines.read_text().splitlines()
    for line in done[seen:]:
        spec.progress.say(driver.line(line))
    return len(done)
