"""What the recorder says it did at the end of a run, and what it names when a run stops.

A black-box target has no flush: its end line must not claim one. A run whose
engine cannot get idle because a pool is full (a steady leak filled it, and
every request waits for pages that never come back) is broken, and the full
pool is named as the cause. And the console's estimate of what is left
counts from the first run: vLLM's start-up, once per gate, is no run's time.
"""

from __future__ import annotations

from probes import make_finding, make_probe

from kvwatch.contracts import FindingKind
from kvwatch.gate.verdicts.detectors import DETECTORS
from kvwatch.harness.progress import Progress, turn_line
from kvwatch.harness.recorder import RecorderOptions, TurnRecorder


class Source:
    """Probes from a script: ``live`` requests that never finish, ``used`` pages of 100."""

    def __init__(self, *, white_box: bool, live: int = 0, used: int = 0, busy=None) -> None:
        self.white_box, self.live, self.used = white_box, live, used
        self.busy = busy or {}
        self.flushes = 0

    def probe(self):
        leak = (make_finding(FindingKind.ORPHAN),) if self.used else ()
        return make_probe(findings=leak, used=self.used, live_requests=self.live)

    def flush(self) -> bool:
        self.flushes += 1
        return True

    def sleep(self, seconds: float) -> None:
        pass

    def answering(self) -> None:
        pass

    def finished(self) -> dict:
        return {"requests": [], "finished": 0, "dropped": 0}

    def gauges(self, series):
        return {s: self.busy.get(s, 0.0) for s in series}

    def session_open(self, session_id: str) -> bool:
        return False


def test_a_black_box_end_says_it_drained_on_its_gauges_and_flushed_nothing():
    source = Source(white_box=False)
    options = RecorderOptions(busy_gauges=("vllm:num_requests_running",), drain_timeout=1)
    recorder = TurnRecorder(source, options)
    recorder.start()
    recorder.finish([])
    assert recorder.ended == (
        "drained (vllm:num_requests_running at 0); not flushed: a black-box target has no flush"
    )
    assert source.flushes == 0
    quiet = TurnRecorder(Source(white_box=False), RecorderOptions())
    quiet.finish([])
    assert quiet.ended.startswith("given 0.5 s to settle")
    line = turn_line({"turn": "end", "ended": recorder.ended, "elapsed": 3.0}, 6)
    assert (
        line.startswith("drained (vllm:num_requests_running at 0); not flushed") and "3.0 s" in line
    )


def test_a_white_box_end_says_sessions_closed_drained_and_flushed():
    source = Source(white_box=True)
    recorder = TurnRecorder(source, RecorderOptions())
    recorder.start()
    recorder.finish([{"process": "p", "sessions": ["sess-0"]}])
    assert recorder.ended == "sessions closed, drained and flushed" and source.flushes == 1


def test_a_full_pool_that_keeps_requests_waiting_breaks_the_run_and_is_named():
    source = Source(white_box=True, live=3, used=100)
    recorder = TurnRecorder(source, RecorderOptions(drain_timeout=0.05))
    recorder.start()
    recorder.barrier(0)
    error = recorder.record().error
    assert error.startswith("the engine did not get idle in 0 s")
    assert "full.kv is full: 100 of 100 pages in use (2 held by no live holder)" in error
    recorder.finish([])
    assert recorder.ended == "not idle in 0 s: probed as it was"


def test_a_stalled_run_names_a_full_pool_and_only_the_first_reason_is_kept():
    recorder = TurnRecorder(Source(white_box=True, used=100), RecorderOptions())
    recorder.broke("no turn barrier completed in 180 s")
    recorder.broke("a later reason")
    record = recorder.record()
    assert record.error.startswith("no turn barrier completed in 180 s; full.kv is full")
    # nothing was judged: the detectors say so instead of passing
    for name in ("allocator", "refcount", "tree"):
        verdict = DETECTORS[name](record._replace(baseline=make_probe(), drained=make_probe()))
        assert verdict.verdict == "skipped" and "180 s" in verdict.note
    roomy = TurnRecorder(Source(white_box=True, used=50), RecorderOptions())
    roomy.broke("no turn barrier completed in 180 s")
    assert roomy.record().error == "no turn barrier completed in 180 s"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_estimate_counts_from_the_first_run_not_from_the_gates_start():
    clock, lines = Clock(), []
    progress = Progress([("p", 1), ("p", 1)], lines.append, clock)
    clock.now += 300  # vLLM starting, before any run
    progress.run_started("p", 1)
    assert lines[-1] == "[1/2] p c=1 (5m00s elapsed)"
    clock.now += 30
    progress.run_finished("p", 1, ["1 requests, 0 failed; every detector passed"])
    progress.run_started("p", 1)
    assert lines[-1] == "[2/2] p c=1 (5m30s elapsed, about 30s left)"
