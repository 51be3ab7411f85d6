"""``GateOptions``: how ``kvwatch gate`` runs, whatever it runs against.

What is under test (the engine, a URL, faults, the model) is the target's
(``kvwatch.targets.select``); these are the gate's own flags: which profiles
and concurrencies, how many turns, where the outputs go and where the verdict
is published. ``validate`` raises ValueError for a usage error (exit 2)
before anything is written.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvwatch import streams
from kvwatch.gate.verdicts.detectors import MIN_JUDGED_TURNS
from kvwatch.harness import outputs
from kvwatch.processes import is_http_url


@dataclass(frozen=True, kw_only=True)
class GateOptions:
    profiles: tuple[str, ...] = ()  # () = every profile the target can run
    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    turns: int | None = None  # None: each profile's own (Profile.turns)
    warmup: int = 2
    out: Path = Path("kvwatch-out")
    junit: Path | None = None
    strict: bool = False  # a notice fails the gate
    locust_workers: int = 0
    jobs: int | None = None  # profiles run side by side; None: one per core
    seed: int = 0
    run_timeout: float = 600.0
    report: bool = True
    pushgateway: str | None = None  # push the verdict metrics here
    grafana_url: str | None = None  # annotate the findings here
    grafana_token: str | None = None
    progress: Callable[[str], None] = field(default=streams.err)  # what it is doing
    result: Callable[[str], None] = field(default=streams.out)  # run results, the verdict

    def validate(self) -> None:
        """Usage errors (the CLI's exit 2) as ValueError."""
        if not self.concurrency or any(not 1 <= c <= 64 for c in self.concurrency):
            raise ValueError("-c takes concurrencies in 1..64, e.g. 1,2,4,8")
        if self.turns is not None and self.turns < self.warmup + MIN_JUDGED_TURNS:
            raise ValueError(
                f"--turns must be at least {self.warmup + MIN_JUDGED_TURNS} "
                f"({self.warmup} warm-up turns and {MIN_JUDGED_TURNS} judged ones)"
            )
        if self.jobs is not None and self.jobs < 1:
            raise ValueError("--jobs must be >= 1")
        if self.locust_workers < 0:
            raise ValueError("--locust-workers must be >= 0")
        for flag, url in (("--pushgateway", self.pushgateway), ("--grafana-url", self.grafana_url)):
            if url is not None and not is_http_url(url):
                raise ValueError(f"{flag} takes an http(s) URL, not {url!r}")
        outputs.out_dir(self.out)
        if self.junit is not None:
            outputs.report_file("--junit", self.junit, self.out)

    def lanes(self, independent: bool, profiles: int) -> int:
        """How many profiles run side by side: one where the target's profiles share
        an engine, else ``--jobs`` (default: one per core), never more than there
        are profiles. Each lane is a server, Locust and a replay engine, busy about
        two thirds of the time on one core (a quarter of the server's time goes to
        the barrier and its drain), so a lane per core keeps the cores busy."""
        if not independent:
            return 1
        return max(1, min(profiles, self.jobs or os.cpu_count() or 1))

    def turns_for(self, profile) -> int:
        """``--turns`` when given, else the profile's own number of turns."""
        return profile.turns if self.turns is None else self.turns
