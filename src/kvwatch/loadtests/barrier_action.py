"""The barrier action: a ``TurnRecorder`` over the probe source the run's plan names.

It runs where the turn barrier's coordinator runs (the Locust master, or the
local runner); the recording itself is ``kvwatch.harness.recorder``, and the
source (kvwatch's probe endpoints, vLLM's engine-core probe, or a black-box
server's gauges) is whatever ``plan.source`` names::

    START   recorder.start(); sample probes every ``sample_every`` s while turns run
    turn t  recorder.barrier(t, reports); a progress line for the gate
    END     recorder.finish(reports) -> the plan's record file

The record is ``RunRecord`` JSON, handed to the gate, which adds what only it
can (coverage, replays on a cache-off engine), judges it and writes
``record.json``. An engine that stops answering ends the record with an
error, never with a clean run.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import gevent
import requests

from kvwatch.harness.plan import RunPlan, probe_source
from kvwatch.harness.recorder import RecorderOptions, TurnRecorder
from kvwatch.loadtests.barrier import END, START


def recorder_options(plan: RunPlan) -> RecorderOptions:
    source = plan.source
    return RecorderOptions(
        warmup=plan.warmup,
        watch=source.watch,
        heap=source.heap,
        census=source.census,
        flush_every_turn=source.flush_every_turn and source.white_box,
        drain_timeout=plan.drain_timeout,
        replays=source.replays,
        usage_gauges=plan.gauges.usage,
        busy_gauges=plan.gauges.busy,
        drain_gauges=plan.gauges.drain,
        settled_gauges=plan.gauges.settled,
        truth_gauges=plan.gauges.truth if source.white_box else (),
    )


class Recorder:
    def __init__(self, plan: RunPlan) -> None:
        self.plan = plan
        self.recorder = TurnRecorder(probe_source(plan, gevent.sleep), recorder_options(plan))
        self.sampler: gevent.Greenlet | None = None
        self.started = time.monotonic()
        self.path = Path(plan.record)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, turn: int, reports: list[dict]) -> None:
        self._stop_sampling()
        try:
            if turn == START:
                self.recorder.start()
            elif turn == END:
                self.recorder.finish(reports)
                self._progress(turn="end", ended=self.recorder.ended, elapsed=self._elapsed())
            else:
                entry = self.recorder.barrier(turn, reports)
                flagged = sum(bool(p.findings or p.exceeded()) for p in entry.probes)
                self._progress(
                    turn=turn,
                    conversations=entry.conversations,
                    probes=len(entry.probes),
                    flagged=flagged,
                    elapsed=self._elapsed(),
                )
        except requests.ConnectionError as exc:
            gone = f"turn {turn}: the engine at {self.plan.target} stopped answering: {exc!r}"
            self.recorder.broke(gone)
        except Exception as exc:  # the run goes on; the gate reports it broke
            self.recorder.broke(f"turn {turn}: {exc!r}")
        if turn == END:
            self._write()
        else:
            self._start_sampling()

    def stalled(self, reason: str) -> None:
        """The run cannot go on: write what there is, with the reason."""
        self._stop_sampling()
        self.recorder.broke(reason)
        self._write()

    def _write(self) -> None:
        self.path.write_text(json.dumps(self.recorder.record().to_json()))

    def _elapsed(self) -> float:
        return round(time.monotonic() - self.started, 1)

    def _progress(self, **fields) -> None:
        with open(f"{self.path}.progress", "a") as f:
            f.write(json.dumps(fields) + "\n")

    # -- probes while a turn runs ---------------------------------------------------------
    def _start_sampling(self) -> None:
        if self.plan.source.white_box and self.plan.sample_every > 0:
            self.sampler = gevent.spawn(self._sample)

    def _stop_sampling(self) -> None:
        if self.sampler is not None:
            self.sampler.kill()
            self.sampler = None

    def _sample(self) -> None:
        while True:
            gevent.sleep(self.plan.sample_every)
            with contextlib.suppress(requests.RequestException):  # best effort mid-turn
                self.recorder.sample()
