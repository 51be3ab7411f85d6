"""A soak's load: Locust running free against one server while a recorder probes it.

    TurnRecorder over HTTP: baseline probe
    Locust for DURATION at -c users, running free in episodes
        every INTERVAL: a probe (a "turn" of the record, at its time into the
        load), which runs between two engine steps, so it must be clean even
        with requests in flight
    time is up: each user ends its turn and closes its sessions (stop timeout)
    TurnRecorder.finish: no request live -> flush the cache -> drained probe

A target that can soak (``Served.soak``) runs this against the server it
started; the gate's ``soak.py`` judges the record. What a soak is asked
(``SoakSpec``) and what its record carries (``SOAK_SIGNALS``: probes, with
the slot table and every registry's size, and the users' request counts; no
heap samples, replays or gauges) are plain records in ``specs.py``.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Protocol

import requests

from kvwatch.harness.locust_run import locust_commands
from kvwatch.harness.plan import ProbeSpec, RunPlan
from kvwatch.harness.recorder import RecorderOptions, TurnRecorder
from kvwatch.harness.run_record import Counts, RunRecord, Soak
from kvwatch.harness.sources import HttpSource
from kvwatch.harness.specs import SoakSpec
from kvwatch.processes import stop


class SoakServer(Protocol):
    """What a soak needs of the server under load."""

    url: str
    token: str

    def exited(self) -> str | None: ...


class SoakLoad:
    """One soak against a running server: Locust runs free while a recorder probes."""

    def __init__(self, spec: SoakSpec, server: SoakServer, users: tuple[str, ...], model: str):
        self.opts, self.server, self.users, self.model = spec, server, users, model
        self.where = spec.where
        self.begun = time.monotonic()
        source = HttpSource(server.url, white_box=True, token=server.token)
        self.recorder = TurnRecorder(
            source,
            # nothing replays a soak's requests: the recorder does not collect them
            RecorderOptions(watch=True, drain_timeout=spec.drain_timeout, replays=False),
            clock=lambda: round(time.monotonic() - self.begun, 3),
        )
        self.probe_errors: list[str] = []

    def record(self) -> RunRecord:
        rec = self.recorder
        try:
            rec.start()
        except requests.RequestException as exc:
            rec.broke(f"the baseline probe failed: {exc!r}")
            return rec.record()
        status, load_s = self._load()
        sent = Counts.from_json(status)
        rec.requests = sent
        rec.soak = Soak(
            duration_s=self.opts.duration,
            warmup_s=self.opts.warmup_s,
            users=self.opts.concurrency,
            episode_ends=tuple(
                (user, round(at - self.begun_wall, 3))
                for user, at in status.get("episode_ends", ())
            ),
            load_s=round(load_s, 1),
            probe_errors=len(self.probe_errors),
        )
        if self.probe_errors:
            rec.broke(f"{len(self.probe_errors)} probes failed; first {self.probe_errors[0]}")
        if dead := sent.unserved():
            rec.broke(dead)
        if rec.error is None:
            try:
                rec.finish()
            except requests.RequestException as exc:
                rec.broke(f"the drain failed: {exc!r}")
        if gone := self.server.exited():  # a dead engine outranks everything it left behind
            rec.error = gone
        return rec.record()

    def _load(self) -> tuple[dict, float]:
        """Locust for the duration, a probe every interval; the users' status counts."""
        opts, where = self.opts, self.where
        status_file = where / "status.json"
        status_file.unlink(missing_ok=True)
        plan = RunPlan(
            profile="soak",
            concurrency=opts.concurrency,
            target=self.server.url,
            record=str(status_file),
            turns=opts.episode_turns,
            seed=opts.seed,
            source=ProbeSpec(white_box=True, token=self.server.token),
            test_controls=True,
            model=self.model,
            soak=True,
        )
        (where / "plan.json").write_text(plan.to_json())
        (cmd,) = locust_commands(
            self.users,
            opts.concurrency,
            self.server.url,
            where / "plan.json",
            where,
            0,
            opts.duration,
            stop_timeout=opts.stop_timeout,
        )
        with (where / "locust.log").open("w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            self.begun, self.begun_wall = time.monotonic(), time.time()
            try:
                self._watch(proc)
            finally:
                stop(proc, grace=5)
        load_s = time.monotonic() - self.begun
        if self.recorder.error is None and proc.returncode != 0:
            self.recorder.broke(
                f"locust exited with {proc.returncode} (see {where / 'locust.log'})"
            )
        status = json.loads(status_file.read_text()) if status_file.exists() else {}
        return status, load_s

    def _watch(self, proc: subprocess.Popen) -> None:
        """Probe every interval until Locust exits (or the server dies, or it overruns)."""
        opts = self.opts
        deadline = self.begun + opts.duration + opts.stop_timeout + 60
        next_probe, note_every = self.begun, max(5.0, opts.duration / 10)
        next_note = self.begun + note_every
        while proc.poll() is None:
            now = time.monotonic()
            if gone := self.server.exited():
                self.recorder.broke(gone)
                return
            if now > deadline:
                self.recorder.broke(
                    f"Locust did not stop {opts.stop_timeout:.0f} s after the soak ended"
                )
                return
            if now >= next_probe:
                try:
                    self.recorder.barrier(len(self.recorder.turns), (), drain=False)
                except requests.RequestException as exc:
                    self.probe_errors.append(f"at {now - self.begun:.1f} s: {exc!r}")
                # every interval; a probe slower than that leaves the engine half of one
                next_probe = max(next_probe + opts.interval, time.monotonic() + opts.interval / 2)
            if now >= next_note:
                next_note += note_every
                opts.progress(self._note(now - self.begun))
            time.sleep(0.05)

    def _note(self, at: float) -> str:
        turns = self.recorder.turns
        if not turns:
            return f"    soak {at:.0f}/{self.opts.duration:.0f} s: no probe yet"
        last = turns[-1].barrier
        pinned = ", ".join(f"{g} {b.pinned}" for g, b in last.bounds.items())
        hits = sum(len(t.barrier.findings) for t in turns)
        return (
            f"    soak {at:.0f}/{self.opts.duration:.0f} s: {len(turns)} probes, {hits} findings, "
            f"{last.live_requests} live requests, pinned {pinned}"
        )
