"""One gate run's Locust processes: started, followed to the end, stopped.

The recorder inside Locust appends a line per barrier to ``record.json.progress``;
this follows that file and prints each barrier as it comes (``console.turn_line``),
with a heartbeat while nothing new arrives.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from kvwatch.gate.console import Progress, turn_line
from kvwatch.gate.servers import locust_commands, stop

if TYPE_CHECKING:
    from kvwatch.gate.pipeline import GateOptions
    from kvwatch.gate.profiles import Profile


def run_locust(
    opts: GateOptions,
    progress: Progress,
    profile: Profile,
    c: int,
    target: str,
    where: Path,
    record: Path,
) -> str | None:
    """Run Locust to the end of the plan; an error message if it broke."""
    cmds = locust_commands(
        profile.user, c, target, where / "plan.json", where, opts.locust_workers, opts.run_timeout
    )
    log = (where / "locust.log").open("w")
    procs = [subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT) for cmd in cmds]
    turns = Path(f"{record}.progress")
    seen, deadline = 0, time.monotonic() + opts.run_timeout + 60
    try:
        while procs[0].poll() is None:
            if time.monotonic() > deadline:
                return f"the load run did not finish in {opts.run_timeout:.0f} s"
            seen = _follow(opts, progress, turns, seen)
            progress.heartbeat(
                f"waiting for turn {seen} of {opts.turns}"
                if seen < opts.turns
                else "waiting for the drain"
            )
            time.sleep(0.2)
        _follow(opts, progress, turns, seen)
        for worker in procs[1:]:
            worker.wait(30)
        if procs[0].returncode != 0:
            return f"locust exited with {procs[0].returncode} (see {where / 'locust.log'})"
        return None
    finally:
        for proc in procs:
            stop(proc, grace=5)
        log.close()


def _follow(opts: GateOptions, progress: Progress, turns: Path, seen: int) -> int:
    """Print the barriers reached since ``seen``; returns how many lines were read."""
    if not turns.exists():
        return seen
    lines = turns.read_text().splitlines()
    for line in lines[seen:]:
        progress.say(f"    {turn_line(json.loads(line), opts.turns)}")
    return len(lines)
