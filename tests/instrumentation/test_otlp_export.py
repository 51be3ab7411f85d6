"""With OTEL_EXPORTER_OTLP_ENDPOINT set, spans and metrics leave over OTLP/HTTP."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

from kvwatch.engine import Engine, SamplingParams
from kvwatch.instrumentation import Telemetry, instrument


class Collector(BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[str, int]]] = []

    def do_POST(self):
        size = int(self.headers.get("content-length", 0))
        body = self.rfile.read(size)
        Collector.received.append((self.path, len(body)))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_spans_and_metrics_reach_an_otlp_http_collector(monkeypatch):
    server = HTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        telemetry = Telemetry()
        engine = Engine()
        instrument(engine.events, engine.stats, telemetry)
        engine.generate(["hello there"], SamplingParams(max_tokens=3))
        telemetry.shutdown()  # flushes the batch span processor and the periodic reader
    finally:
        server.shutdown()
    paths = {path for path, size in Collector.received if size > 0}
    assert {"/v1/traces", "/v1/metrics"} <= paths, Collector.received
