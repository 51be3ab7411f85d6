"""One gate run under Locust: the plan written, Locust started and followed, the record read.

Every target that is driven over HTTP (kvwatch's server, a black-box server,
vLLM) runs its turns this way::

    run_turns(plan, spec, user)
        OUT/runs/P-cN/plan.json       the plan Locust reads (--kvwatch-plan)
        locust (runner or master + workers)   users do turns; the barrier action records
        plan.record                   the run, handed over by the barrier action, read
                                      back and removed: the gate writes record.json once,
                                      with what it adds (coverage, replays)

The barrier action appends a line per barrier to ``plan.record + ".progress"``;
this follows that file and prints each barrier as it comes
(``progress.turn_line``), with a heartbeat while nothing new arrives.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

from kvwatch.harness.plan import RunPlan
from kvwatch.harness.progress import Progress, turn_line
from kvwatch.harness.run_record import RunRecord
from kvwatch.harness.specs import RunSpec
from kvwatch.harness.time_spent import TimeSpent, barrier_phases, load_phases
from kvwatch.processes import free_port, stop

# found without importing it: importing Locust's user classes pulls gevent in
LOCUSTFILE = Path(importlib.util.find_spec("kvwatch.loadtests").origin).parent / "locustfile.py"
HANDOVER = "locust-record.json"  # the barrier action's record, read back and removed


def run_turns(plan: RunPlan, spec: RunSpec, user: str) -> RunRecord:
    """Run ``user`` under Locust to the end of ``plan``; the record it handed over,
    or an empty record whose error says why there is none."""
    where, record = spec.where, Path(plan.record)
    for stale in (record, progress_file(record)):
        stale.unlink(missing_ok=True)
    (where / "plan.json").write_text(plan.to_json())
    spawned = time.time()
    error = _run_locust(plan, spec, user)
    exited = time.time()
    if error is None and not record.exists():
        error = "the load run ended without a record (see locust.log)"
    if error is not None:
        return RunRecord(turns=(), error=error)
    run = RunRecord.from_json(json.loads(record.read_text()))
    record.unlink()
    progress_file(record).unlink(missing_ok=True)
    ends = [t.at for t in run.turns if t.at is not None]
    phases = load_phases(spawned, run.started_at, ends, run.warmup, run.ended_at, exited)
    phases |= barrier_phases([t.settle_s for t in run.turns], [t.barrier_s for t in run.turns])
    return run._replace(spent=TimeSpent(run_s=exited - spawned, **phases))


def progress_file(record: Path) -> Path:
    return Path(f"{record}.progress")


def _run_locust(plan: RunPlan, spec: RunSpec, user: str) -> str | None:
    """Run Locust to the end of the plan; an error message if it broke."""
    where, progress = spec.where, spec.progress
    cmds = locust_commands(
        user,
        spec.concurrency,
        plan.target,
        where / "plan.json",
        where,
        spec.locust_workers,
        spec.run_timeout,
    )
    log = (where / "locust.log").open("w")
    procs = [subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT) for cmd in cmds]
    turns = progress_file(Path(plan.record))
    seen, deadline = 0, time.monotonic() + spec.run_timeout + 60
    try:
        while procs[0].poll() is None:
            if progress.cancelled:  # the gate was interrupted: its lanes stop here
                raise KeyboardInterrupt
            if time.monotonic() > deadline:
                return f"the load run did not finish in {spec.run_timeout:.0f} s"
            seen = _follow(progress, turns, seen, plan.turns)
            progress.heartbeat(
                f"waiting for turn {seen} of {plan.turns}"
                if seen < plan.turns
                else "waiting for the drain"
            )
            time.sleep(0.2)
        _follow(progress, turns, seen, plan.turns)
        for worker in procs[1:]:
            worker.wait(30)
        if procs[0].returncode != 0:
            return f"locust exited with {procs[0].returncode} (see {where / 'locust.log'})"
        return None
    finally:
        for proc in procs:
            stop(proc, grace=5)
        log.close()


def _follow(progress: Progress, turns: Path, seen: int, planned: int) -> int:
    """Print the barriers reached since ``seen``; returns how many lines were read."""
    if not turns.exists():
        return seen
    lines = turns.read_text().splitlines()
    for line in lines[seen:]:
        progress.say(f"    {turn_line(json.loads(line), planned)}")
    return len(lines)


def locust_commands(
    user: str | tuple[str, ...],
    concurrency: int,
    host: str,
    plan: Path,
    out: Path,
    workers: int,
    timeout: float,
    *,
    stop_timeout: float = 0.0,
) -> list[list[str]]:
    """The Locust command lines of one run: the runner (or master) first, then workers.

    ``timeout`` is Locust's run time; ``stop_timeout`` lets each user finish the
    task it is in (and its ``on_stop``) when that time is up.
    """
    users = (user,) if isinstance(user, str) else tuple(user)
    base = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--kvwatch-plan", str(plan)]
    main = [
        *base,
        *("--headless", "-u", str(concurrency), "-r", str(concurrency), "--host", host),
        *("--csv", str(out / "locust"), "--html", str(out / "locust.html")),
        *("--exit-code-on-error", "0", "--only-summary", "--loglevel", "WARNING"),
        *("-t", f"{int(timeout)}s"),
        *(("--stop-timeout", f"{int(stop_timeout)}s") if stop_timeout else ()),
    ]
    if not workers:
        return [[*main, *users]]
    port = free_port()
    master = [
        *main,
        *("--master", "--expect-workers", str(workers)),
        *("--master-bind-host", "127.0.0.1", "--master-bind-port", str(port)),
        *users,
    ]
    worker = [
        *base,
        *("--worker", "--master-host", "127.0.0.1", "--master-port", str(port)),
        *("--loglevel", "WARNING", *users),
    ]
    return [master, *[worker] * workers]
