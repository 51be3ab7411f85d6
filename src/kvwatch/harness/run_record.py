"""The run record: what a recorder writes and the detectors read.

A run is a series of turns. Each turn carries the probe reports taken while
it ran (the last one at the barrier, after the engine drained), how many
conversations were live and how much context they held, and optionally a
heap sample and black-box gauge readings. Around the turns: the baseline
probe, the drained probe (sessions closed, cache flushed), the greedy
requests the run served (``candidates``, which the equivalence check
replays on a cache-off engine into ``replays``) and the requests sent.

A soak is the same record over time: each "turn" is one probe taken while
requests were in flight, ``at`` seconds into the load, and ``soak`` says when
the users' episodes ended (the usage trend is judged over whole episodes).

``RunRecord.from_json(record.to_json()) == record``; the JSON is what
``OUT/runs/<profile>-c<c>/record.json`` holds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import NamedTuple

from kvwatch.contracts import ProbeReport
from kvwatch.harness.flush_reading import FlushReading
from kvwatch.harness.time_spent import TimeSpent

KEEP_FAILURES = 5  # failed requests and 5xx answers kept as evidence, per run


class Signal(StrEnum):
    """What a target's run records can carry. A detector needs some of these
    (``detectors.NEEDS``) and judges every target whose records carry them all."""

    PROBES = "probes"  # audited probe reports: pools by owner, findings, bounds
    SLOTS = "slots"  # probes carry a snapshot-slot table
    REGISTRIES = "registries"  # probes carry the size of every container the server holds
    HEAP = "heap"  # heap samples by allocation site
    REPLAYS = "replays"  # greedy and seeded requests replayed on a cache-off engine
    GAUGES = "gauges"  # usage and drain gauges from a Prometheus page
    REQUESTS = "requests"  # the clients' request counts and failures


class SiteGrowth(NamedTuple):
    site: str  # file:line
    size_diff: int  # bytes
    count_diff: int  # live allocations


class HeapSample(NamedTuple):
    traced_bytes: int  # bytes allocated in the sampled scope and still alive
    # (bytes grown, traceback) since the previous sample, largest first
    top: tuple[tuple[int, tuple[str, ...]], ...] = ()
    by_site: dict[str, int] | None = None  # live bytes per allocation site (file:line)
    since_mark: tuple[SiteGrowth, ...] = ()  # growing sites since the sampler's mark

    @classmethod
    def from_sampler(cls, data: dict) -> HeapSample:
        """From the heap sampler's JSON (``kvwatch.instrumentation.heap_tracker``, the snapshot endpoint)."""
        top = tuple((g["size_diff"], tuple(g["traceback"])) for g in data.get("top_growth", ()))
        since = tuple(
            SiteGrowth(g["site"], g["size_diff"], g["count_diff"])
            for g in data.get("since_mark", ())
        )
        return cls(data["traced_bytes"], top, data.get("by_site"), since)

    def to_json(self) -> dict:
        return {
            "traced_bytes": self.traced_bytes,
            "top": [[size, list(tb)] for size, tb in self.top],
            "by_site": self.by_site,
            "since_mark": [list(g) for g in self.since_mark],
        }

    @classmethod
    def from_json(cls, data: dict | None) -> HeapSample | None:
        if not data:
            return None
        top = tuple((size, tuple(tb)) for size, tb in data.get("top", ()))
        since = tuple(SiteGrowth(*g) for g in data.get("since_mark", ()))
        return cls(data["traced_bytes"], top, data.get("by_site"), since)


class Candidate(NamedTuple):
    """A request the run served whose output its prompt and parameters decide
    (greedy, or sampled with a seed): equivalence replays it."""

    turn: int  # the barrier after which it was collected
    prompt: tuple[int, ...]
    output: tuple[int, ...]  # what the run produced
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # what it exercised while it ran (server/finished.py): shallow, page-edge, ...
    marks: tuple[str, ...] = ()

    @classmethod
    def from_finished(cls, turn: int, data: dict) -> Candidate:
        """From an entry of the server's ``GET /debug/finished``."""
        return cls(
            turn,
            tuple(data["prompt"]),
            tuple(data["output"]),
            data["max_tokens"],
            data.get("temperature", 0.0),
            data.get("top_p", 1.0),
            data.get("seed"),
            tuple(data.get("stop_token_ids", ())),
            data.get("ignore_eos", False),
            tuple(data.get("marks", ())),
        )

    def to_json(self) -> list:
        params = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "stop_token_ids": list(self.stop_token_ids),
            "ignore_eos": self.ignore_eos,
            "marks": list(self.marks),
        }
        return [self.turn, list(self.prompt), list(self.output), self.max_tokens, params]

    @classmethod
    def from_json(cls, data: list) -> Candidate:
        turn, prompt, output, max_tokens, *rest = data
        params = rest[0] if rest else {}
        return cls.from_finished(
            turn, {"prompt": prompt, "output": output, "max_tokens": max_tokens, **params}
        )


class Replay(NamedTuple):
    turn: int
    prompt: tuple[int, ...]
    cached: tuple[int, ...]  # what the run produced
    reference: tuple[int, ...]  # what a cache-off engine produces


class Counts(NamedTuple):
    """The requests one client process sent, or all of a run's together."""

    status: dict[str, int]  # answers by status class: 2xx, 3xx, 4xx, 5xx, none
    failed: int  # requests the client counted as failed
    broken_turns: int  # turns whose own code raised
    # the first few failed requests or 5xx answers: {name, status (0: no answer), error, body}
    first_failures: tuple[dict, ...] = ()

    @property
    def requests(self) -> int:
        """HTTP requests sent, and broken turns (each a failure of its own)."""
        return sum(self.status.values()) + self.broken_turns

    @property
    def errors(self) -> int:
        return self.failed + self.broken_turns

    def unserved(self) -> str | None:
        """Why these counts say the engine never served the run, or None: such a
        run is broken, whatever its probes say."""
        if self.requests == 0:
            return "no request reached the server"
        if self.errors >= self.requests:
            return f"every one of the {self.requests} requests failed (see locust.log)"
        return None

    def to_json(self) -> dict:
        return {**self._asdict(), "first_failures": list(self.first_failures)}

    @classmethod
    def from_json(cls, data: dict | None) -> Counts:
        data = data or {}
        return cls(
            dict(data.get("status", {})),
            data.get("failed", 0),
            data.get("broken_turns", 0),
            # records written before failures other than 5xx were kept call them first_5xx
            tuple(data.get("first_failures", data.get("first_5xx", ()))),
        )


def merge_counts(reports: Iterable[tuple[str, Counts]]) -> Counts:
    """All client processes together, from (process, counts) pairs; a process's
    counts only grow, so its largest report is its last."""
    last: dict[str, Counts] = {}
    for process, counts in reports:
        if process not in last or counts.requests >= last[process].requests:
            last[process] = counts
    status: Counter[str] = Counter()
    for counts in last.values():
        status.update(counts.status)
    return Counts(
        status=dict(status),
        failed=sum(c.failed for c in last.values()),
        broken_turns=sum(c.broken_turns for c in last.values()),
        first_failures=tuple(f for c in last.values() for f in c.first_failures)[:KEEP_FAILURES],
    )


class Timings(NamedTuple):
    """Every answered completion's timings as its client measured them, and the
    usage the server returned (``loadtests/timings.py``): all client processes
    together once merged."""

    ttft_ms: tuple[float, ...] = ()  # streams: request sent to first content chunk
    itl_ms: tuple[float, ...] = ()  # streams: mean gap between content chunks
    e2e_ms: tuple[float, ...] = ()  # every answered completion, whole
    # (whole request in ms, output tokens) of each that finished (stop or length)
    finished: tuple[tuple[float, int], ...] = ()
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of the prompt tokens, found in the prefix cache
    output_tokens: int = 0
    window: tuple[float, float] | None = None  # wall-clock start of the first, end of the last

    def to_json(self) -> dict:
        return {**self._asdict(), "window": list(self.window) if self.window else None}

    @classmethod
    def from_json(cls, data: dict | None) -> Timings | None:
        if not data:
            return None
        return cls(
            ttft_ms=tuple(data.get("ttft_ms", ())),
            itl_ms=tuple(data.get("itl_ms", ())),
            e2e_ms=tuple(data.get("e2e_ms", ())),
            finished=tuple((ms, tokens) for ms, tokens in data.get("finished", ())),
            prompt_tokens=data.get("prompt_tokens", 0),
            cached_tokens=data.get("cached_tokens", 0),
            output_tokens=data.get("output_tokens", 0),
            window=tuple(data["window"]) if data.get("window") else None,
        )


def merge_timings(reports: Iterable[Timings]) -> Timings | None:
    """Several client processes' timings as one."""
    parts = list(reports)
    if not parts:
        return None
    windows = [t.window for t in parts if t.window is not None]
    return Timings(
        ttft_ms=tuple(x for t in parts for x in t.ttft_ms),
        itl_ms=tuple(x for t in parts for x in t.itl_ms),
        e2e_ms=tuple(x for t in parts for x in t.e2e_ms),
        finished=tuple(x for t in parts for x in t.finished),
        prompt_tokens=sum(t.prompt_tokens for t in parts),
        cached_tokens=sum(t.cached_tokens for t in parts),
        output_tokens=sum(t.output_tokens for t in parts),
        window=(min(w[0] for w in windows), max(w[1] for w in windows)) if windows else None,
    )


class Turn(NamedTuple):
    turn: int
    probes: tuple[ProbeReport, ...]  # during the turn; the last one at the barrier
    conversations: int = 0  # live conversations (agents and sub-agents) after the turn
    context_tokens: int = 0  # tokens those conversations hold
    heap: HeapSample | None = None
    gauges: dict[str, float] | None = None  # black-box readings at the barrier
    at: float | None = None  # when the barrier probe was taken (epoch s; soak: s into the load)
    requests: Counts | None = None  # what the clients had sent by this barrier
    # white-box: the pool gauges around the barrier probe, the engine idle (None: not
    # read, or they moved between the reads around the probe)
    pool_gauges: dict[str, float] | None = None
    # the barrier's wall time: waiting for the engine to finish what the clients left
    # (``settle_s``), then the probes, flushes and samples at the idle engine (``barrier_s``)
    settle_s: float = 0.0
    barrier_s: float = 0.0

    @property
    def barrier(self) -> ProbeReport | None:
        return self.probes[-1] if self.probes else None

    def to_json(self) -> dict:
        return {
            "turn": self.turn,
            "probes": [p.to_json() for p in self.probes],
            "conversations": self.conversations,
            "context_tokens": self.context_tokens,
            "heap": self.heap.to_json() if self.heap is not None else None,
            "gauges": self.gauges,
            "at": self.at,
            "requests": self.requests.to_json() if self.requests is not None else None,
            "pool_gauges": self.pool_gauges,
            "settle_s": self.settle_s,
            "barrier_s": self.barrier_s,
        }

    @classmethod
    def from_json(cls, t: dict) -> Turn:
        return cls(
            t["turn"],
            tuple(ProbeReport.from_json(p) for p in t["probes"]),
            t.get("conversations", 0),
            t.get("context_tokens", 0),
            HeapSample.from_json(t.get("heap")),
            t.get("gauges") or None,
            t.get("at"),
            Counts.from_json(t["requests"]) if t.get("requests") else None,
            t.get("pool_gauges"),
            t.get("settle_s", 0.0),
            t.get("barrier_s", 0.0),
        )


class Soak(NamedTuple):
    """What makes a record a soak: its turns are probes over time."""

    duration_s: float  # seconds of load asked for
    warmup_s: float  # left out of the usage trend
    users: int
    episode_ends: tuple[tuple[int, float], ...]  # (user, seconds into the load)
    load_s: float = 0.0  # seconds the load ran, its stop included
    probe_errors: int = 0  # probes that got no answer

    def to_json(self) -> dict:
        return {**self._asdict(), "episode_ends": [list(e) for e in self.episode_ends]}

    @classmethod
    def from_json(cls, data: dict | None) -> Soak | None:
        if not data:
            return None
        ends = tuple((int(u), float(t)) for u, t in data.get("episode_ends", ()))
        return cls(
            data["duration_s"],
            data["warmup_s"],
            data["users"],
            ends,
            data.get("load_s", 0.0),
            data.get("probe_errors", 0),
        )


class RunRecord(NamedTuple):
    turns: tuple[Turn, ...]
    warmup: int = 2  # turns discarded before judging a trend
    baseline: ProbeReport | None = None  # probe before the first turn
    drained: ProbeReport | None = None  # probe after sessions closed and the cache flushed
    replays: tuple[Replay, ...] = ()
    error: str | None = None  # the run broke (the gate exits 3)
    # black-box: drain gauges before the first turn and after the run ended
    gauges_baseline: dict[str, float] | None = None
    gauges_drained: dict[str, float] | None = None
    candidates: tuple[Candidate, ...] = ()  # comparable requests served, to replay
    finished: int = 0  # requests the engine finished, comparable or not
    output_tokens: int = 0  # tokens generated by every request that ended (the server's count)
    requests: Counts | None = None  # what the clients sent (None: not counted)
    soak: Soak | None = None
    # the heap once the run drained and flushed; its ``since_mark`` is the growth
    # since the barrier that ended the warm-up
    heap_end: HeapSample | None = None
    # lifecycle transitions the run took, per machine (``lifecycle.py``)
    coverage: Mapping[str, Mapping[str, int]] = {}
    # live instances per kvwatch class at the warm-up's end and once drained (``census``)
    census_mark: Mapping[str, int] | None = None
    census_end: Mapping[str, int] | None = None
    timings: Timings | None = None  # what the answered completions cost their clients
    sessions_opened: int = 0  # sessions the users said they opened
    sessions_left: tuple[str, ...] = ()  # of those, still open once the run drained
    started_at: float | None = None  # the recorder's clock once its baseline was taken
    ended_at: float | None = None  # and once the run was drained
    spent: TimeSpent | None = None  # where the run's time went (``time_spent.py``)
    flushed: FlushReading | None = None  # pool gauges around the drain's flush
    # counters' rises over the run, by series (kvwatch's server: ``counter_truth.py``)
    counters: Mapping[str, float] | None = None

    def to_json(self) -> dict:
        return {
            "turns": [t.to_json() for t in self.turns],
            "warmup": self.warmup,
            "baseline": self.baseline.to_json() if self.baseline else None,
            "drained": self.drained.to_json() if self.drained else None,
            "replays": [
                [r.turn, list(r.prompt), list(r.cached), list(r.reference)] for r in self.replays
            ],
            "error": self.error,
            "gauges_baseline": self.gauges_baseline,
            "gauges_drained": self.gauges_drained,
            "candidates": [c.to_json() for c in self.candidates],
            "finished": self.finished,
            "output_tokens": self.output_tokens,
            "requests": self.requests.to_json() if self.requests is not None else None,
            "soak": self.soak.to_json() if self.soak is not None else None,
            "heap_end": self.heap_end.to_json() if self.heap_end is not None else None,
            "coverage": {m: dict(edges) for m, edges in self.coverage.items()},
            "census_mark": dict(self.census_mark) if self.census_mark is not None else None,
            "census_end": dict(self.census_end) if self.census_end is not None else None,
            "timings": self.timings.to_json() if self.timings is not None else None,
            "sessions_opened": self.sessions_opened,
            "sessions_left": list(self.sessions_left),
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "spent": self.spent.to_json() if self.spent is not None else None,
            "flushed": self.flushed.to_json() if self.flushed is not None else None,
            "counters": dict(self.counters) if self.counters is not None else None,
        }

    @classmethod
    def from_json(cls, data: dict) -> RunRecord:
        replays = tuple(
            Replay(
                turn=turn, prompt=tuple(prompt), cached=tuple(cached), reference=tuple(reference)
            )
            for turn, prompt, cached, reference in data.get("replays", ())
        )
        candidates = tuple(Candidate.from_json(c) for c in data.get("candidates", ()))
        return cls(
            turns=tuple(Turn.from_json(t) for t in data.get("turns", ())),
            warmup=data.get("warmup", 2),
            baseline=_probe(data.get("baseline")),
            drained=_probe(data.get("drained")),
            replays=replays,
            error=data.get("error"),
            gauges_baseline=data.get("gauges_baseline") or None,
            gauges_drained=data.get("gauges_drained") or None,
            candidates=candidates,
            finished=data.get("finished", 0),
            output_tokens=data.get("output_tokens", 0),
            requests=Counts.from_json(data["requests"]) if data.get("requests") else None,
            soak=Soak.from_json(data.get("soak")),
            heap_end=HeapSample.from_json(data.get("heap_end")),
            coverage=data.get("coverage") or {},
            census_mark=data.get("census_mark"),
            census_end=data.get("census_end"),
            timings=Timings.from_json(data.get("timings")),
            sessions_opened=data.get("sessions_opened", 0),
            sessions_left=tuple(data.get("sessions_left", ())),
            started_at=data.get("started_at"),
            ended_at=data.get("ended_at"),
            spent=TimeSpent.from_json(data.get("spent")),
            flushed=FlushReading.from_json(data.get("flushed")),
            counters=data.get("counters"),
        )


def _probe(data: dict | None) -> ProbeReport | None:
    return ProbeReport.from_json(data) if data else None
