"""The barrier action: a ``TurnRecorder`` over the server's HTTP probe endpoints.

It runs where the turn barrier's coordinator runs (the Locust master, or the
local runner); the recording itself is ``kvwatch.gate.recorder``::

    START   recorder.start(); sample probes every ``sample_every`` s while turns run
    turn t  recorder.barrier(t, reports); a progress line for the gate
    END     recorder.finish(reports) -> record.json

The record is ``RunRecord`` JSON; the gate loads it, replays its candidates
on a cache-off engine and runs the detectors. An engine that stops answering
ends the record with an error, never with a clean run.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import gevent
import requests

from kvwatch.gate.plan import RunPlan
from kvwatch.gate.recorder import RecorderOptions, TurnRecorder
from kvwatch.gate.sources import HttpSource
from kvwatch.loadtests.barrier import END, START


def white_box(plan: RunPlan) -> bool:
    """Probes are taken: kvwatch's server, or vLLM with kvwatch's probe."""
    return plan.probe or plan.vllm_probe is not None


def recorder_options(plan: RunPlan) -> RecorderOptions:
    return RecorderOptions(
        warmup=plan.warmup,
        watch=plan.watch and plan.probe,
        heap=plan.heap and plan.probe,
        flush_every_turn=plan.flush_every_turn and white_box(plan),
        drain_timeout=plan.drain_timeout,
        replays=plan.probe,
        usage_gauges=plan.gauges.usage,
        busy_gauges=plan.gauges.busy,
        drain_gauges=plan.gauges.drain,
    )


def _source(plan: RunPlan) -> HttpSource:
    if plan.vllm_probe is not None:
        from kvwatch.targets.vllm_source import VllmProbeSource

        return VllmProbeSource(
            plan.target,
            plan.vllm_probe,
            metrics_url=plan.metrics_url,
            metrics_settle=plan.metrics_settle,
            sleep=gevent.sleep,
        )
    return HttpSource(
        plan.target,
        white_box=plan.probe,
        token=plan.probe_token,
        metrics_url=plan.metrics_url,
        metrics_settle=plan.metrics_settle,
        sleep=gevent.sleep,
    )


class Recorder:
    def __init__(self, plan: RunPlan) -> None:
        self.plan = plan
        self.recorder = TurnRecorder(_source(plan), recorder_options(plan))
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
                self._progress(turn="end", elapsed=self._elapsed())
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
        if white_box(self.plan) and self.plan.sample_every > 0:
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
