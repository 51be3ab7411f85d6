"""kvwatch's server as a ``HistoryTarget`` (``kvwatch-http``): the history tier over HTTP.

The same engine as ``histories.KvwatchHistoryTarget`` (its small pools,
``sets`` and ``faults``, its cache-off reference), served by kvwatch's own
server (``server.create_app``, with the probe on and step by step, as
``kvwatch serve --enable-probe --step-by-step`` serves it but without the
telemetry ``serve`` wires to it) under uvicorn with ``kvwatch serve``'s
settings, on a loopback port of its own for each history, in a thread of this
process. The history's clients are real HTTP clients (``http_loop.HttpLoop``):
keep-alive connections that idle between requests, every other request
streamed, clients that leave by closing their connection in whatever stage
their request is. What the in-process target cannot see, this one judges too:
the server's parsing and fitting of each request, its handling of a client
that leaves, the token ids a client is sent, and the registries and
departures ``/debug/probe`` reports after every step.

The server tells no cache events over HTTP, so ``index`` and ``references``
are the in-process target's checks (the same engine); everything else runs.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn

from kvwatch.contracts import ProbeReport
from kvwatch.engine import Engine
from kvwatch.server import EngineWorker, ServerSettings, create_app
from kvwatch.server.uvicorn_settings import uvicorn_settings
from kvwatch.sockets import listen_socket, socket_url
from kvwatch.targets.driver.step_probe import StepProbe
from kvwatch.targets.kvwatch.histories import KvwatchHistoryTarget
from kvwatch.targets.kvwatch.http_loop import HttpLoop

START_S = 120.0
SETTINGS = ServerSettings(enable_probe=True, step_by_step=True)


class ServedLoop(HttpLoop):
    """An ``HttpLoop`` over a server of its own, stopped with the loop."""

    def __init__(self, target: KvwatchHistoryTarget) -> None:
        app = create_app(EngineWorker(Engine(target.config)), SETTINGS)
        self.sock = listen_socket("127.0.0.1", 0)
        options = uvicorn_settings("127.0.0.1", 0, "warning", SETTINGS.max_header_bytes)
        self.server = uvicorn.Server(uvicorn.Config(app, **options))
        self.thread = threading.Thread(
            target=self.server.run, args=([self.sock],), name="kvwatch-http", daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + START_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self._stop()
                raise RuntimeError("kvwatch's server did not start for the history")
            time.sleep(0.01)
        super().__init__(socket_url(self.sock))

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._stop()

    def _stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


class HttpProbe(StepProbe):
    """``GET /debug/probe`` after every step: the engine's probe, the server's registries
    and the departures it owes (a client that left with its request still live)."""

    def __init__(self, loop: HttpLoop) -> None:
        super().__init__()
        self.loop = loop
        loop.observers.append(self.remember)

    def report(self) -> ProbeReport:
        status, data = self.loop.pool.json("GET", "/debug/probe")
        if status != 200:
            raise RuntimeError(f"GET /debug/probe answered {status}: {data!r}"[:300])
        return ProbeReport.from_json(data)

    def holdings(self):
        return ()


class KvwatchHttpHistoryTarget(KvwatchHistoryTarget):
    engine = "kvwatch-http"

    def make_loop(self) -> ServedLoop:  # type: ignore[override]
        return ServedLoop(self)

    def make_probe(self, loop: ServedLoop) -> HttpProbe:  # type: ignore[override]
        return HttpProbe(loop)

    def make_watch(self, loop: ServedLoop) -> None:  # type: ignore[override]
        return None

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "engine": self.engine}
