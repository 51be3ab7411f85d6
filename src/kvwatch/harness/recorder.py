"""TurnRecorder: the barrier protocol, over any probe source, into a ``RunRecord``.

Every way kvwatch records a run drives this one class; only where the probes
come from differs (``sources.py``: an engine in this process, or a server's
HTTP probe endpoints)::

    start()                 baseline probe, per-step watching and heap tracking
                            on, drain gauges, usage gauges' starting values
    sample()                a probe while the turn runs (best effort), and the
                            probes the engine kept since (``watch``)
    barrier(t, reports)     drain to idle -> (flush) -> barrier probe, heap
                            sample, each usage gauge's rise since start()
                            per live conversation; the turn's
                            samples go with it; the greedy and seeded
                            requests the engine finished become candidates
                            for the equivalence replay, the users' request
                            counts so far are kept; the last
                            warm-up barrier marks the heap
    finish(reports)         the users' request counts -> drain -> flush ->
                            drained probe, drain gauges and the heap's growth
                            since the mark (what the judged turns left behind),
                            and which of the sessions the users opened the
                            engine still holds open; ``ended`` says which of
                            these it did (a black-box target has no flush)
    record()                the RunRecord so far

A soak calls ``barrier(i, (), drain=False)`` for each probe it takes while the
load runs. Without probes (a black-box target) only gauges are read, and
every barrier first checks that the target still answers: gauges may come
from elsewhere and stay flat after the engine is gone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from kvwatch.contracts import OWNERSHIP, ProbeReport
from kvwatch.harness.flush_reading import FlushReading
from kvwatch.harness.run_record import (
    Candidate,
    Counts,
    HeapSample,
    RunRecord,
    Soak,
    Timings,
    Turn,
    merge_counts,
    merge_timings,
)

HEAP_SITES = 40  # allocation sites followed per heap sample
HEAP_TOP = 5  # growths by traceback kept as evidence
HEAP_SINCE_MARK = 20  # growing sites kept at the end of a run


class ProbeSource(Protocol):
    """What the recorder needs from an engine. ``white_box``: probes and flush exist."""

    white_box: bool

    def probe(self) -> ProbeReport: ...

    def flush(self) -> bool:
        """Evict everything unreferenced; False while requests still run."""
        ...

    def watch(self) -> None:
        """Have the engine probe after every step and keep what shows a finding."""
        ...

    def latched(self) -> list[ProbeReport]:
        """The probes the engine kept since the previous call (see ``watch``)."""
        ...

    def finished(self) -> dict:
        """The comparable requests finished since the last call (the server's
        ``GET /debug/finished``: ``requests``, ``finished``, ``dropped``)."""
        ...

    def heap_start(self) -> None: ...

    def heap_mark(self) -> None:
        """Keep the heap now as the reference of later samples' ``since_mark``."""
        ...

    def heap_sample(self, sites: int, top: int) -> HeapSample: ...

    def gauges(self, series: Sequence[str]) -> dict[str, float]: ...

    def census(self) -> dict[str, int]:
        """Live instances of each of the engine's own classes (``kvwatch.instrumentation.census``)."""
        ...

    def session_open(self, session_id: str) -> bool:
        """Whether the engine still holds the session open (False where it has no
        sessions, or cannot say)."""
        ...

    def answering(self) -> None:
        """Raise ``ConnectionError`` if the engine no longer takes requests."""
        ...

    def sleep(self, seconds: float) -> None: ...


@dataclass(frozen=True, kw_only=True)
class RecorderOptions:
    warmup: int = 2
    watch: bool = False  # probes after every engine step, kept when they show a finding
    heap: bool = False  # heap samples at barriers (white-box only)
    census: bool = False  # a census at the warm-up's end and after the drain (white-box)
    flush_every_turn: bool = False  # flush the cache at every barrier (white-box only)
    drain_timeout: float = 120.0
    replays: bool = True  # collect finished comparable requests for the equivalence replay
    usage_gauges: tuple[str, ...] = ()  # trended at barriers, per live conversation
    busy_gauges: tuple[str, ...] = ()  # their sum is 0 when the engine is idle
    drain_gauges: tuple[str, ...] = ()  # back at their starting value after the run
    settled_gauges: tuple[str, ...] = ()  # back at their value when the warm-up ended
    truth_gauges: tuple[str, ...] = ()  # read around the drain's flush (``FlushReading``)


def _counts(reports: Sequence[Mapping]) -> Counts | None:
    """The users' request counts, merged over their client processes (None: none sent)."""
    counted = [(r["process"], Counts.from_json(r["counts"])) for r in reports if "counts" in r]
    return merge_counts(counted) if counted else None


def _timings(reports: Sequence[Mapping]) -> Timings | None:
    """The users' timings, merged over their client processes: each process's
    last report (the one with the most answered requests) stands for it."""
    last: dict[str, Timings] = {}
    for r in reports:
        if (t := Timings.from_json(r.get("timings"))) is not None:
            process = r.get("process", "local")
            if process not in last or len(t.e2e_ms) >= len(last[process].e2e_ms):
                last[process] = t
    return merge_timings(last.values())


def full_pools(probe: ProbeReport) -> str:
    """``G is full: U of C pages in use (L held by no live holder), so requests wait
    for pages that do not come back`` for the groups of ``probe`` with no page free or
    evictable; empty when none is."""
    full = []
    for name, group in probe.groups.items():
        if group.capacity > 0 and group.free + group.evictable <= 0:
            lost = {
                page
                for f in probe.findings
                if f.group == name and f.kind in OWNERSHIP
                for page in f.pages
            }
            held = f" ({len(lost)} held by no live holder)" if lost else ""
            full.append(f"{name} is full: {group.used} of {group.capacity} pages in use{held}")
    if not full:
        return ""
    return f"{'; '.join(full)}, so requests wait for pages that do not come back"


class TurnRecorder:
    def __init__(
        self,
        source: ProbeSource,
        options: RecorderOptions = RecorderOptions(),
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.source, self.options, self.clock = source, options, clock
        self.turns: list[Turn] = []
        self.sampled: list[ProbeReport] = []
        self.candidates: list[Candidate] = []
        self.finished = 0
        self.output_tokens = 0  # generated by every request that ended, as the server counts
        self.baseline: ProbeReport | None = None
        self.drained: ProbeReport | None = None
        self.gauges_baseline: dict[str, float] | None = None
        self.gauges_drained: dict[str, float] | None = None
        self.usage_start: dict[str, float] = {}
        self.requests: Counts | None = None
        self.soak: Soak | None = None
        self.heap_end: HeapSample | None = None
        self.flushed: FlushReading | None = None
        self.timings: Timings | None = None
        self.census_mark: dict[str, int] | None = None
        self.census_end: dict[str, int] | None = None
        self.sessions_opened: tuple[str, ...] = ()
        self.sessions_left: tuple[str, ...] = ()
        self.error: str | None = None
        self.stuck = False  # a drain timed out: later ones do not wait again
        self.ended = ""  # what ``finish`` did, in words, for the progress line
        self.started_at: float | None = None  # the clock once ``start`` is done
        self.ended_at: float | None = None  # and once ``finish`` is

    @property
    def white_box(self) -> bool:
        return self.source.white_box

    # -- the protocol ---------------------------------------------------------------------
    def start(self) -> None:
        if self.white_box:
            self.baseline = self.source.probe()
            if self.options.watch:
                self.source.watch()
            if self.options.heap:
                self.source.heap_start()
        self.gauges_baseline = self._read(self.options.drain_gauges)
        self.usage_start = self._read(self.options.usage_gauges)
        self.started_at = self.clock()

    def sample(self) -> None:
        """A probe while requests run; the next barrier keeps it with its turn."""
        if self.white_box:
            self._collect_latched()
            self.sampled.append(self.source.probe())

    def barrier(self, turn: int, reports: Sequence[Mapping] = (), *, drain: bool = True) -> Turn:
        began = time.monotonic()
        self.source.answering()
        if drain:
            self._drain()
        idle_at = time.monotonic()
        if self.white_box and self.options.flush_every_turn:
            self.source.flush()
        conversations = sum(r.get("conversations", 0) for r in reports)
        probes, pool = (), None
        if self.white_box:
            self._collect_latched()
            self.sampled.sort(key=lambda p: p.step)
            pool, last = self._around(self.source.probe)
            probes = (*self.sampled, last)
        self.sampled = []
        # the replay buffer is the harness's memory, not the engine's: hand it
        # over before the heap is sampled
        self._collect_finished(turn)
        heap = None
        if self.white_box and self.options.heap:
            heap = self.source.heap_sample(HEAP_SITES, HEAP_TOP)
            if drain and turn == self.options.warmup - 1:
                self.source.heap_mark()
        if drain and turn == self.options.warmup - 1 and self.white_box and self.options.census:
            self.census_mark = self.source.census()
        if drain and turn == self.options.warmup - 1 and self.options.settled_gauges:
            settled = self._read(self.options.settled_gauges)
            self.gauges_baseline = {**(self.gauges_baseline or {}), **settled}
        per_conversation = {
            f"{k}/conversation": rise / max(conversations, 1)
            for k, rise in self._usage_rise().items()
        }
        entry = Turn(
            turn=turn,
            probes=probes,
            conversations=conversations,
            context_tokens=sum(r.get("context_tokens", 0) for r in reports),
            heap=heap,
            gauges=per_conversation or None,
            at=self.clock(),
            requests=_counts(reports),
            pool_gauges=pool,
            settle_s=round(idle_at - began, 3),
            barrier_s=round(time.monotonic() - idle_at, 3),
        )
        self.turns.append(entry)
        return entry

    def finish(self, reports: Sequence[Mapping] = ()) -> None:
        """The end of the run: drained, flushed, probed. An engine that never gets
        idle is probed as it is; its live requests fail the drain rule."""
        self.requests = _counts(reports) or self.requests
        self.timings = _timings(reports)
        self.source.answering()
        deadline = time.monotonic() + self.options.drain_timeout
        closed = "sessions closed, " if any(r.get("sessions") for r in reports) else ""
        if not self.white_box:
            self._drain()
            self.ended = f"{closed}{self._settled()}; not flushed: a black-box target has no flush"
        else:
            flushed, before = False, None
            while not self.stuck and self._idle_by(deadline):
                before = self._before_flush()
                if flushed := self.source.flush():
                    break  # else a request arrived between idle and flush: wait again
            self.ended = closed + (
                "drained and flushed"
                if flushed
                else f"not idle in {self.options.drain_timeout:.0f} s: probed as it was"
            )
            after, drained = self._around(self.source.probe)
            self.drained = self._with_leftovers(drained)
            if flushed and before is not None and after is not None:
                self.flushed = before._replace(gauges_after=after)
            self._collect_finished(len(self.turns))
            self._sessions_left(reports)
            if self.census_mark is not None:
                self.census_end = self.source.census()
            if self.options.heap and self.turns:
                self.heap_end = self.source.heap_sample(HEAP_SITES, HEAP_SINCE_MARK)
        self.gauges_drained = self._read(self.options.drain_gauges + self.options.settled_gauges)
        self.ended_at = self.clock()

    def _settled(self) -> str:
        """How a black-box run was let settle: its busy gauges at 0, or a pause."""
        if self.options.busy_gauges:
            return f"drained ({' + '.join(self.options.busy_gauges)} at 0)"
        return "given 0.5 s to settle (no gauge says when it is idle)"

    def broke(self, reason: str) -> None:
        """The run cannot go on; the first reason is the one kept, with any full pool
        named: requests that wait for pages are what stops a load."""
        if self.error is None:
            self.error = reason + self._full_pools()

    def _full_pools(self) -> str:
        """``; `` and ``full_pools`` of a probe taken now; empty without one."""
        if not self.white_box:
            return ""
        try:
            probe = self._probe()
        except Exception:  # the engine no longer answers: nothing to name
            return ""
        full = full_pools(probe)
        return f"; {full}" if full else ""

    def record(self) -> RunRecord:
        return RunRecord(
            turns=tuple(self.turns),
            warmup=self.options.warmup,
            baseline=self.baseline,
            drained=self.drained,
            error=self.error,
            gauges_baseline=self.gauges_baseline or None,
            gauges_drained=self.gauges_drained or None,
            candidates=tuple(self.candidates),
            finished=self.finished,
            output_tokens=self.output_tokens,
            requests=self.requests,
            soak=self.soak,
            heap_end=self.heap_end,
            timings=self.timings,
            census_mark=self.census_mark,
            census_end=self.census_end,
            sessions_opened=len(self.sessions_opened),
            sessions_left=self.sessions_left,
            started_at=self.started_at,
            ended_at=self.ended_at,
            flushed=self.flushed,
        )

    # -- pieces ---------------------------------------------------------------------------
    def _with_leftovers(self, drained: ProbeReport) -> ProbeReport:
        """The drained probe with the findings of the probes taken since the last
        barrier (while the run drained) that it does not carry itself."""
        left = [f for p in self.sampled for f in p.findings]
        self.sampled = []
        have = {f.identity for f in drained.findings}
        new = tuple(dict.fromkeys(f for f in left if f.identity not in have))
        return drained._replace(findings=(*new, *drained.findings)) if new else drained

    def _around(self, probe: Callable[[], ProbeReport]) -> tuple[dict | None, ProbeReport]:
        """``probe()`` with the pool gauges read before and after it: the gauges, when
        the two reads agree (nothing moved: they say what the probe saw), and the probe.
        None where the target names no pool gauges, or something moved (an idle
        timeout closing a session between the reads)."""
        if not self.options.truth_gauges:
            return None, probe()
        first = self._read(self.options.truth_gauges)
        report = probe()
        return (first if self._read(self.options.truth_gauges) == first else None), report

    def _before_flush(self) -> FlushReading | None:
        """The probe and the pool gauges of the idle engine, just before its flush
        (None where the target names no pool gauges, or they moved around the probe)."""
        gauges, report = self._around(self._probe)
        if gauges is None:
            return None
        return FlushReading(before=report, gauges_before=gauges, gauges_after={})

    def _sessions_left(self, reports: Sequence[Mapping]) -> None:
        """Every session the users say they opened must be closed once the run has
        drained: the count of live sessions against the baseline cannot see it,
        since the users open their sessions before the baseline is taken."""
        self.sessions_opened = tuple(sid for r in reports for sid in r.get("sessions", ()))
        self.sessions_left = tuple(s for s in self.sessions_opened if self.source.session_open(s))

    def _collect_finished(self, turn: int) -> None:
        """The comparable requests finished since the last call, as candidates."""
        if self.white_box and self.options.replays:
            done = self.source.finished()
            self.finished += done["finished"]
            self.output_tokens += done.get("tokens", 0)
            self.candidates += [Candidate.from_finished(turn, r) for r in done["requests"]]

    def _probe(self) -> ProbeReport:
        """A probe taken to look (is the engine idle? which pools are full?), kept with
        the next barrier's probes when it carries findings: a server reports some of
        them once only, in whichever probe comes next (a request still running after
        its client left, a session past its idle timeout, a container over its
        bound), so a probe that was only looked at must not drop them."""
        report = self.source.probe()
        if report.findings:
            self.sampled.append(report)
        return report

    def _collect_latched(self) -> None:
        if self.options.watch:
            self.sampled += self.source.latched()

    def _read(self, series: Sequence[str]) -> dict[str, float]:
        return self.source.gauges(series) if series else {}

    def _usage_rise(self) -> dict[str, float]:
        """Each usage gauge less its value when the run started.

        A server that has served before may start a run with usage left over
        (an earlier run's leak, a warm cache). The trend is judged against the
        level the series reaches, so an offset it did not make would hide a
        rise it did make; only the run's own rise counts.
        """
        now = self._read(self.options.usage_gauges)
        return {k: v - self.usage_start.get(k, 0.0) for k, v in now.items()}

    def _idle_by(self, deadline: float) -> bool:
        """White-box: wait until no request is live; False (and ``stuck``) if
        ``deadline`` passed first."""
        while time.monotonic() < deadline:
            if self._probe().live_requests == 0:
                return True
            self.source.sleep(0.05)
        self.stuck = True
        if self._full_pools():  # requests that cannot get pages: the run cannot go on
            self.broke(f"the engine did not get idle in {self.options.drain_timeout:.0f} s")
        return False

    def _drain(self) -> None:
        """Wait until the engine runs nothing (clients have left; aborts may still land).

        White-box, an engine that never gets idle is not an error of the run:
        its barrier probes show the live requests, the drained probe fails the
        drain rule with them, and no later barrier waits for it again, so such
        a run ends in about one drain timeout instead of one per turn.
        """
        if self.stuck:
            return
        deadline = time.monotonic() + self.options.drain_timeout
        if self.white_box:
            self._idle_by(deadline)
            return
        while time.monotonic() < deadline:
            if not self.options.busy_gauges:
                self.source.sleep(0.5)  # nothing says when it is idle: give it a moment
                return
            elif sum(self.source.gauges(self.options.busy_gauges).values()) == 0:
                return
            self.source.sleep(0.05)
        self.stuck = True
        raise TimeoutError(f"the engine did not drain in {self.options.drain_timeout:.0f} s")
