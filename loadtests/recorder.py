"""The barrier action: drain, probe, scrape; at the end, flush, check and replay.

It runs where the turn barrier's coordinator runs (the Locust master, or the
local runner) and talks to the server over HTTP only::

    START   baseline probe, gauges and heap tracking on; start sampling probes
    turn t  drain to idle -> (flush) -> barrier probe, heap sample, gauges per
            conversation; probes sampled while the turn ran go with it
    END     the users' request counts -> drain -> flush -> drained probe and
            gauges -> replay greedy requests, one at a time on a flushed cache
            -> write the run record

The record is JSON in the shape of ``kvwatch.instrumentation.detectors``'
``RunRecord``; the gate loads it and runs the detectors. Without the probe
(black-box), only gauges are recorded, and every barrier first checks that the
target still answers: its gauges may come from elsewhere (an exporter, a
Prometheus) and stay flat after the engine is gone. An engine that stops
answering ends the record with an error, never with a clean run.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import gevent
import requests

from kvwatch.instrumentation.record import Counts, merge_counts
from kvwatch.loadtests.barrier import END, START
from kvwatch.loadtests.plan import RunPlan
from kvwatch.loadtests.scrape import read_series

TIMEOUT = 60.0
HEAP_SITES = 40
HEAP_FRAMES = 1  # a deeper traceback costs every allocation the server makes


class Recorder:
    def __init__(self, plan: RunPlan) -> None:
        self.plan = plan
        self.http = requests.Session()
        if plan.probe_token:
            self.http.headers["Authorization"] = f"Bearer {plan.probe_token}"
        self.record: dict = {"warmup": plan.warmup, "turns": [], "replays": [], "error": None}
        self.sampled: list[dict] = []
        self.sampler: gevent.Greenlet | None = None
        self.started = time.monotonic()
        self.path = Path(plan.record)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    # -- the barrier action ---------------------------------------------------------------
    def __call__(self, turn: int, reports: list[dict]) -> None:
        self._stop_sampling()
        try:
            if turn == START:
                self._start()
            elif turn == END:
                self._finish(reports)
            else:
                self._barrier(turn, reports)
        except requests.ConnectionError as exc:
            gone = f"turn {turn}: the engine at {self.plan.target} stopped answering: {exc!r}"
            self.record["error"] = self.record["error"] or gone
        except Exception as exc:  # the run goes on; the gate reports it broke
            self.record["error"] = self.record["error"] or f"turn {turn}: {exc!r}"
        if turn == END:
            self.path.write_text(json.dumps(self.record))
        else:
            self._start_sampling()

    def _start(self) -> None:
        if self.plan.probe:
            self.record["baseline"] = self._probe()
            if self.plan.heap:
                self._post(f"/debug/tracemalloc/start?frames={HEAP_FRAMES}")
        self.record["gauges_baseline"] = self._gauges(self.plan.gauges.drain)

    def _barrier(self, turn: int, reports: list[dict]) -> None:
        self._answering()
        self._drain()
        if self.plan.probe and self.plan.flush_every_turn:
            self._post("/debug/flush_cache")
        conversations = sum(r.get("conversations", 0) for r in reports)
        entry = {
            "turn": turn,
            "probes": [*self.sampled, self._probe()] if self.plan.probe else [],
            "conversations": conversations,
            "context_tokens": sum(r.get("context_tokens", 0) for r in reports),
            "heap": self._heap() if self.plan.probe and self.plan.heap else None,
            "gauges": self._gauges(self.plan.gauges.usage, conversations),
            "candidates": [c for r in reports for c in r.get("replays", ())],
            "at": time.time(),
        }
        self.record["turns"].append(entry)
        barrier = entry["probes"][-1] if entry["probes"] else {}
        self._progress(
            turn=turn,
            conversations=conversations,
            findings=len(barrier.get("findings", ())),
            elapsed=round(time.monotonic() - self.started, 1),
        )

    def _finish(self, reports: list[dict]) -> None:
        sent = merge_counts(
            (r["process"], Counts.from_json(r["counts"])) for r in reports if "counts" in r
        )
        self.record["requests"] = sent.to_json()
        self._answering()
        self._drain()
        if self.plan.probe:
            self._post("/debug/flush_cache")
            self.record["drained"] = self._probe()
        self.record["gauges_drained"] = self._gauges(self.plan.gauges.drain)
        if self.plan.probe:
            self.record["replays"] = self._replays()
        self._progress(turn="end", elapsed=round(time.monotonic() - self.started, 1))

    def stalled(self, reason: str) -> None:
        """The run cannot go on: write what there is, with the reason."""
        self._stop_sampling()
        self.record["error"] = self.record["error"] or reason
        self.path.write_text(json.dumps(self.record))

    # -- pieces ---------------------------------------------------------------------------
    def _url(self, path: str) -> str:
        return self.plan.target.rstrip("/") + path

    def _get(self, path: str) -> dict:
        resp = self.http.get(self._url(path), timeout=TIMEOUT)
        resp.raise_for_status()
        return resp.json()

    def _post(self, path: str, body: dict | None = None) -> dict:
        resp = self.http.post(self._url(path), json=body, timeout=TIMEOUT)
        resp.raise_for_status()
        return resp.json()

    def _probe(self) -> dict:
        return self._get("/debug/probe")

    def _answering(self) -> None:
        """Black-box: the target still takes connections (any HTTP answer will do);
        requests.ConnectionError if it does not. The probe checks this itself."""
        if not self.plan.probe:
            self.http.get(self._url("/v1/models"), timeout=TIMEOUT)

    def _drain(self) -> None:
        """Wait until the engine runs nothing (clients have left; aborts may still land)."""
        deadline = time.monotonic() + self.plan.drain_timeout
        while time.monotonic() < deadline:
            if self.plan.probe:
                if self._probe()["live_requests"] == 0:
                    return
            elif not self.plan.gauges.busy:
                gevent.sleep(0.5)  # nothing says when it is idle: give it a moment
                return
            elif sum(self._gauges(self.plan.gauges.busy).values()) == 0:
                return
            gevent.sleep(0.05)
        raise TimeoutError(f"the engine did not drain in {self.plan.drain_timeout:.0f} s")

    def _heap(self) -> dict:
        snap = self._get(f"/debug/tracemalloc/snapshot?scope=engine&sites={HEAP_SITES}&top=5")
        top = [[g["size_diff"], g["traceback"]] for g in snap["top_growth"]]
        return {"traced_bytes": snap["traced_bytes"], "top": top, "by_site": snap["by_site"]}

    def _gauges(
        self, series: tuple[str, ...], conversations: int | None = None
    ) -> dict[str, float]:
        """The series' values now; with ``conversations``, per live conversation."""
        if not series or not self.plan.metrics_url:
            return {}
        gevent.sleep(self.plan.metrics_settle)
        resp = self.http.get(self.plan.metrics_url, timeout=TIMEOUT)
        resp.raise_for_status()
        values = read_series(resp.text, series)
        if conversations is None:
            return values
        return {f"{k}/conversation": v / max(conversations, 1) for k, v in values.items()}

    def _replays(self) -> list:
        """Greedy requests from judged turns again, each alone on a flushed cache:
        what a cache-off engine would have produced."""
        late = [
            (t["turn"], c)
            for t in self.record["turns"]
            if t["turn"] >= self.plan.warmup
            for c in t["candidates"]
        ]
        out = []
        for turn, (prompt, cached, max_tokens) in late[: self.plan.replays]:
            self._post("/debug/flush_cache")
            body = {
                "model": self.plan.model,
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0,
                "return_token_ids": True,
            }
            reference = self._post("/v1/completions", body)["choices"][0]["token_ids"]
            out.append([turn, prompt, cached, reference])
        self._post("/debug/flush_cache")
        return out

    def _progress(self, **fields) -> None:
        with open(f"{self.path}.progress", "a") as f:
            f.write(json.dumps(fields) + "\n")

    # -- probes while a turn runs ---------------------------------------------------------
    def _start_sampling(self) -> None:
        self.sampled = []
        if self.plan.probe and self.plan.sample_every > 0:
            self.sampler = gevent.spawn(self._sample)

    def _stop_sampling(self) -> None:
        if self.sampler is not None:
            self.sampler.kill()
            self.sampler = None

    def _sample(self) -> None:
        while True:
            gevent.sleep(self.plan.sample_every)
            with contextlib.suppress(requests.RequestException):  # best effort mid-turn
                self.sampled.append(self._probe())
