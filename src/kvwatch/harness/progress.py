"""What a gate run prints while it runs: one line per event.

Progress goes to stderr (``emit``), results to stdout (``tell``), so
``kvwatch gate > log`` keeps every run's result and the verdict::

    stderr  [3/28] agentic-trie c=4 (2m10s elapsed, about 12m left)
    stderr      turn 0: 4 conversations, 0 of 32 probes with findings (1 of 6 turns, 9.5 s)
    stderr      ...
    stderr      sessions closed, drained and flushed (88.2 s)
    stdout  agentic-trie c=4: 159 requests, 0 failed
    stdout      FAIL allocator at turn 3: full.kv: 12 pinned pages, live holders (4) justify 9
    stdout      FAIL heap after the drain: engine/records.py:125: ...

Turns are numbered from 0 here as in ``summary.json``, the JUnit file and the
report; the check made once the run has drained is "after the drain". The
estimate weighs each run by its concurrency (a run at c = 8 takes about four
times one at c = 1 on the default profiles), scaled by how long the finished
runs took: an estimate, printed as one.

When profiles run side by side (``--jobs``), each has a ``Lane``: the same
lines through one ``Progress`` (a lock keeps each line, and each run's result
lines, whole), with the indented ones naming their run, since another run's
lines come between them::

    stderr  [2/32] edges c=1 (1m02s elapsed, about 3m40s left)
    stderr      edges c=1: turn 0: 2 conversations, 0 of 6 probes with findings (...)
    stderr      agentic-trie c=4: turn 3: 4 conversations, 0 of 9 probes with findings (...)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

# between two lines of a run, the longest the gate stays silent
HEARTBEAT_S = 30.0


def duration(seconds: float) -> str:
    """``42s``, ``2m10s``, ``1h05m``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def weight(concurrency: int) -> float:
    """A run's share of the gate's time (c = 1, 2, 4, 8 took 34, 54, 88 and 129 s
    on agentic-trie: about 1 + c / 2)."""
    return 1.0 + concurrency / 2


class Progress:
    """Numbers the runs, times them and estimates what is left.

    ``emit`` takes progress lines, ``tell`` result lines (``emit`` too when
    not given). ``clock`` is injectable so the estimate is testable without
    waiting.
    """

    def __init__(
        self,
        plan: Sequence[tuple[str, int]],
        emit: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
        tell: Callable[[str], None] | None = None,
    ) -> None:
        self.plan, self.emit, self.clock = list(plan), emit, clock
        self.tell = tell or emit
        self.started = clock()
        self.first_run: float | None = None  # the pace counts from here, not the gate's start
        self.done_weight = 0.0
        self.index = 0
        self.last_line = self.started
        self.lock = threading.RLock()  # lanes print from threads of their own
        self.cancel = threading.Event()  # set: every lane stops before its next step

    @property
    def cancelled(self) -> bool:
        return self.cancel.is_set()

    def lane(self) -> Lane:
        """A view for one profile's runs when several run side by side."""
        return Lane(self)

    def say(self, line: str) -> None:
        with self.lock:
            self.emit(line)
            self.last_line = self.clock()

    def heartbeat(self, doing: str) -> None:
        """A line saying what is going on, once nothing was printed for a while."""
        with self.lock:
            if self.clock() - self.last_line >= HEARTBEAT_S:
                self.say(f"    ... {doing} ({duration(self.clock() - self.started)} elapsed)")

    def left(self) -> float | None:
        """Seconds the runs not yet finished should take, from the finished ones' pace
        (with lanes, the pace they keep together). The pace counts from the first
        run's start: what the gate did before it (vLLM starting, once for the whole
        gate) is no run's time."""
        if self.done_weight == 0 or self.first_run is None:
            return None
        pace = (self.clock() - self.first_run) / self.done_weight
        return pace * max(0.0, sum(weight(c) for _, c in self.plan) - self.done_weight)

    def run_started(self, profile: str, concurrency: int) -> None:
        with self.lock:
            if self.first_run is None:
                self.first_run = self.clock()
            self.index += 1
            elapsed = duration(self.clock() - self.started)
            left = self.left()
            eta = f", about {duration(left)} left" if left is not None else ""
            self.say(
                f"[{self.index}/{len(self.plan)}] {profile} c={concurrency} "
                f"({elapsed} elapsed{eta})"
            )

    def run_finished(self, profile: str, concurrency: int, lines: Sequence[str]) -> None:
        """A run's result, on the result stream: its name and first line, then the
        others indented (the gate's verdict side writes them: ``gate/outputs/console.py``)."""
        with self.lock:
            self.done_weight += weight(concurrency)
            head, *rest = lines
            self.tell(f"{profile} c={concurrency}: {head}")
            for line in rest:
                self.tell(f"    {line}")
            self.last_line = self.clock()

    def runs_skipped(self, concurrencies: Sequence[int]) -> None:
        """Runs that never started (their server did not come up) still count as done."""
        with self.lock:
            self.index += len(concurrencies)
            self.done_weight += sum(weight(c) for c in concurrencies)


class Lane:
    """One profile's runs when profiles run side by side: ``Progress``'s calls,
    with each indented line (a turn, a replay, a heartbeat) naming its run."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.run = ""

    @property
    def cancelled(self) -> bool:
        return self.progress.cancelled

    def say(self, line: str) -> None:
        if self.run and line.startswith("    "):
            line = f"    {self.run}: {line[4:]}"
        self.progress.say(line)

    def heartbeat(self, doing: str) -> None:
        self.progress.heartbeat(f"{self.run}: {doing}" if self.run else doing)

    def run_started(self, profile: str, concurrency: int) -> None:
        self.run = f"{profile} c={concurrency}"
        self.progress.run_started(profile, concurrency)

    def run_finished(self, profile: str, concurrency: int, lines: Sequence[str]) -> None:
        self.progress.run_finished(profile, concurrency, lines)

    def runs_skipped(self, concurrencies: Sequence[int]) -> None:
        self.progress.runs_skipped(concurrencies)


def turn_line(progress: dict, turns: int) -> str:
    """A barrier the recorder reported (``recorder.py``'s progress file)."""
    if progress["turn"] == "end":  # what the end did, as the recorder says (older: all three)
        ended = progress.get("ended") or "sessions closed, drained and flushed"
        return f"{ended} ({progress['elapsed']} s)"
    probes = ""
    if progress["probes"]:
        probes = f", {progress['flagged']} of {progress['probes']} probes with findings"
    return (
        f"turn {progress['turn']}: {progress['conversations']} conversations{probes} "
        f"({progress['turn'] + 1} of {turns} turns, {progress['elapsed']} s)"
    )
