"""What the gate asks of a served target: plain records, nothing that runs.

``RunSpec`` is one run (``Served.run``), ``SoakSpec`` one soak
(``Served.soak``), ``SOAK_SIGNALS`` what a soak's record carries. The seam
(``target.py``) names them and the code that runs Locust (``locust_run.py``,
``soak_load.py``) reads them; this module imports neither, so the seam loads
nothing that starts a process and nothing imports in a circle::

    target.py ──► specs.py ◄── locust_run.py ◄── soak_load.py
                                    (imported by the targets that run the load)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvwatch.harness.progress import Progress
from kvwatch.harness.run_record import Signal

# what a soak's record carries: probes (with the slot table and every registry's
# size) and the users' request counts; no heap samples, replays or gauges
SOAK_SIGNALS = frozenset({Signal.PROBES, Signal.SLOTS, Signal.REGISTRIES, Signal.REQUESTS})


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """One run the gate asks of a served target."""

    profile: Any  # one of the target's profiles
    concurrency: int
    turns: int
    warmup: int
    seed: int
    where: Path  # the run's folder: OUT/runs/PROFILE-cN
    progress: Progress
    locust_workers: int = 0
    run_timeout: float = 600.0


@dataclass(frozen=True, kw_only=True)
class SoakSpec:
    """One soak the gate asks of a served target."""

    duration: float  # seconds of load
    concurrency: int  # Locust users
    where: Path  # OUT/soak: the plan, Locust's files, its log
    seed: int = 0
    episode_turns: int = 6  # turns before a user closes its conversations and starts anew
    interval: float = 1.0  # seconds between probes
    warmup_s: float = 0.0  # left out of the usage trend
    stop_timeout: float = 60.0  # each user finishes its turn and closes its sessions
    drain_timeout: float = 120.0
    progress: Callable[[str], None] = print  # a line now and then while it runs
