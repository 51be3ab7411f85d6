"""Probe sources for the ``TurnRecorder``: where a recorded run's probes come from.

* ``CallableSource``: any callable that returns a probe (``engine.probe``, or
  an HTTP getter), for tests that drive an engine themselves (the pytest
  plugin); the heap is this process's.
* ``HttpSource``: a server's probe endpoints (``kvwatch serve
  --enable-probe``) and its ``/metrics`` page, or, for a black-box target,
  the page alone. It uses ``requests``, so it is cooperative under gevent
  (the Locust coordinator) and plain blocking elsewhere (the soak).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import requests

from kvwatch.contracts import ProbeReport
from kvwatch.harness.run_record import HeapSample
from kvwatch.harness.scrape import read_series
from kvwatch.instrumentation.census import census

if TYPE_CHECKING:
    from kvwatch.harness.plan import RunPlan
from kvwatch.instrumentation.heap_tracker import HeapTracker

TIMEOUT = 60.0
HEAP_FRAMES = 1  # the remote sampler's frames: a deeper traceback costs every allocation
HEAP_SCOPE = "kvwatch"  # what kvwatch's own code in the server process allocated


class CallableSource:
    """Probes from a callable returning a ``ProbeReport`` or its JSON; the heap of
    this process, in ``heap_scope`` (a file glob; None: everything)."""

    def __init__(
        self,
        probe: Callable[[], Any],
        *,
        flush: Callable[[], object] | None = None,
        finished: Callable[[], dict] | None = None,
        heap_scope: str | None = None,
        heap_frames: int = 8,
    ) -> None:
        self._probe, self._flush, self._finished = probe, flush, finished
        self._scope = "scope" if heap_scope else "process"
        self._heap = HeapTracker({"scope": heap_scope} if heap_scope else {})
        self._frames = heap_frames
        self.white_box = True

    def probe(self) -> ProbeReport:
        report = self._probe()
        return report if isinstance(report, ProbeReport) else ProbeReport.from_json(report)

    def flush(self) -> bool:
        if self._flush is not None:
            self._flush()
        return True

    def finished(self) -> dict:
        if self._finished is None:
            return {"requests": [], "finished": 0, "dropped": 0}
        return self._finished()

    def watch(self) -> None:
        pass  # the caller probes at its own barriers

    def timing(self) -> dict:
        """The engine thread's CPU time since the server started (steps, watch, calls)."""
        return self._call("GET", "/debug/timing")

    def latched(self) -> list[ProbeReport]:
        return []

    def heap_start(self) -> None:
        self._heap.start(self._frames)

    def heap_mark(self) -> None:
        self._heap.mark(self._scope)

    def heap_sample(self, sites: int, top: int) -> HeapSample:
        return HeapSample.from_sampler(self._heap.sample(self._scope, top, sites))

    def heap_stop(self) -> None:
        self._heap.stop()

    def gauges(self, series: Sequence[str]) -> dict[str, float]:
        return {}

    def session_open(self, session_id: str) -> bool:
        return False  # an engine driven in process closes its own sessions

    def census(self) -> dict[str, int]:
        return census()

    def answering(self) -> None:
        pass

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class HttpSource:
    """A server over HTTP: its probe endpoints when ``white_box``, its gauges always."""

    def __init__(
        self,
        target: str,
        *,
        white_box: bool,
        token: str | None = None,
        metrics_url: str | None = None,
        metrics_settle: float = 0.1,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.target, self.white_box = target.rstrip("/"), white_box
        self.metrics_url, self.metrics_settle, self._sleep = metrics_url, metrics_settle, sleep
        self.http = requests.Session()
        if token:
            self.http.headers["Authorization"] = f"Bearer {token}"

    @classmethod
    def for_plan(cls, plan: RunPlan, *, sleep: Callable[[float], None] = time.sleep) -> HttpSource:
        """The run's server: its probe endpoints when the plan says it is white-box."""
        return cls(
            plan.target,
            white_box=plan.source.white_box,
            token=plan.source.token,
            metrics_url=plan.metrics_url,
            metrics_settle=plan.metrics_settle,
            sleep=sleep,
        )

    def probe(self) -> ProbeReport:
        return ProbeReport.from_json(self._call("GET", "/debug/probe"))

    def flush(self) -> bool:
        resp = self.http.post(f"{self.target}/debug/flush_cache", timeout=TIMEOUT)
        if resp.status_code == 409:  # requests still run
            return False
        resp.raise_for_status()
        return True

    def watch(self) -> None:
        self._call("POST", "/debug/watch?on=true")

    def finished(self) -> dict:
        return self._call("GET", "/debug/finished")

    def coverage(self) -> dict:
        """Lifecycle transitions the server has taken since it started, per machine."""
        return self._call("GET", "/debug/coverage")

    def timing(self) -> dict:
        """The engine thread's CPU time since the server started (steps, watch, calls)."""
        return self._call("GET", "/debug/timing")

    def latched(self) -> list[ProbeReport]:
        return [ProbeReport.from_json(p) for p in self._call("GET", "/debug/latched")["probes"]]

    def heap_start(self) -> None:
        self._call("POST", f"/debug/tracemalloc/start?frames={HEAP_FRAMES}")

    def heap_mark(self) -> None:
        self._call("POST", f"/debug/tracemalloc/mark?scope={HEAP_SCOPE}")

    def heap_sample(self, sites: int, top: int) -> HeapSample:
        path = f"/debug/tracemalloc/snapshot?scope={HEAP_SCOPE}&sites={sites}&top={top}"
        return HeapSample.from_sampler(self._call("GET", path))

    def gauges(self, series: Sequence[str]) -> dict[str, float]:
        if not series or not self.metrics_url:
            return {}
        self._sleep(self.metrics_settle)  # past the exporter's caching of engine stats
        resp = self.http.get(self.metrics_url, timeout=TIMEOUT)
        resp.raise_for_status()
        return read_series(resp.text, tuple(series))

    def arm_failpoints(self, armed: bool) -> None:
        """Arm or disarm the server engine's failpoints (``POST /debug/failpoints``)."""
        self._call("POST", f"/debug/failpoints?armed={str(armed).lower()}")

    def census(self) -> dict[str, int]:
        """Live instances of each kvwatch class in the server (``GET /debug/census``)."""
        return self._call("GET", "/debug/census")["census"]

    def session_open(self, session_id: str) -> bool:
        """White-box: ``GET /v1/sessions/{id}`` answers 200 while it is open (409
        once closed, 404 for an id never seen); a black-box target is not asked."""
        if not self.white_box:
            return False
        return self.http.get(f"{self.target}/v1/sessions/{session_id}", timeout=TIMEOUT).ok

    def answering(self) -> None:
        """Black-box: any HTTP answer will do; the probe checks this itself."""
        if not self.white_box:
            self.http.get(f"{self.target}/v1/models", timeout=TIMEOUT)

    def sleep(self, seconds: float) -> None:
        self._sleep(seconds)

    def _call(self, method: str, path: str) -> dict:
        resp = self.http.request(method, f"{self.target}{path}", timeout=TIMEOUT)
        resp.raise_for_status()
        return resp.json()
