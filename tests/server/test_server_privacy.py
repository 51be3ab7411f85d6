"""Prompt text stays out of logs and spans unless ``--capture-content`` asks for it on spans.

A distinctive prompt goes through every kind of request (chat and completion,
streamed or not, a session turn, refused ones). Nothing the server writes
holds it: not its output at DEBUG level (every logger, uvicorn's included),
not the span file, not the spans in memory. With content capture on, the
spans carry it and the logs still do not.
"""

from __future__ import annotations

import json
import logging

import httpx
import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from serverproc import kvwatch_server

from kvwatch.engine import Engine
from kvwatch.instrumentation import Telemetry, instrument
from kvwatch.server import EngineWorker, ServerSettings, create_app

SECRET = "Zebra-quartz-7741 pelican"


def exchange(send) -> list[int]:
    """Every kind of request that carries the prompt; returns their statuses."""
    user = [{"role": "user", "content": SECRET}]
    chat = {"model": "tiny", "messages": user, "max_tokens": 3}
    text = {"model": "tiny", "prompt": SECRET, "max_tokens": 3}
    statuses = [
        send("POST", "/v1/chat/completions", chat),
        send("POST", "/v1/chat/completions", {**chat, "stream": True}),
        send("POST", "/v1/completions", text),
        send("POST", "/v1/completions", {**text, "stream": True, "logprobs": 1}),
        send("POST", "/v1/sessions", {"session_id": "private"}),
        send("POST", "/v1/chat/completions", {**chat, "session_id": "private"}),
        send("DELETE", "/v1/sessions/private", None),
        # refused: too long, a bad field next to the prompt, a session that is gone
        send("POST", "/v1/completions", {**text, "prompt": SECRET * 200}),
        send("POST", "/v1/chat/completions", {**chat, "temperature": "hot"}),
        send("POST", "/v1/chat/completions", {**chat, "session_id": "private"}),
    ]
    assert statuses == [200] * 7 + [400, 400, 409], statuses
    return statuses


@pytest.mark.e2e
def test_kvwatch_serve_at_debug_level_writes_no_prompt_text(tmp_path):
    log = tmp_path / "serve.log"
    flags = ("--log-level", "debug", "--run-dir", str(tmp_path))
    with kvwatch_server(*flags, log=log) as url:

        def send(method, path, body):
            return httpx.request(method, f"{url}{path}", json=body, timeout=300).status_code

        exchange(send)
    written = log.read_text()
    assert "POST /v1/chat/completions" in written  # the access log ran at DEBUG
    assert SECRET not in written
    spans = (tmp_path / "spans.jsonl").read_text()
    assert '"chat tiny"' in spans and SECRET not in spans


@pytest.mark.parametrize("capture", [False, True], ids=["default", "capture-content"])
def test_prompt_text_reaches_spans_only_on_opt_in_and_never_logs(capture, caplog, capfd):
    caplog.set_level(logging.DEBUG)  # the root logger: every logger that propagates
    engine, exporter = Engine(), InMemorySpanExporter()
    telemetry = Telemetry(span_processors=[SimpleSpanProcessor(exporter)], otlp=False)
    instrument(engine.events, engine.stats, telemetry, stats_max_age=0)
    app = create_app(EngineWorker(engine), ServerSettings(capture_content=capture))
    with TestClient(app) as client:
        exchange(lambda m, p, b: client.request(m, p, json=b).status_code)
    telemetry.shutdown()
    spans = json.dumps([json.loads(s.to_json()) for s in exporter.get_finished_spans()])
    assert '"chat tiny"' in spans
    assert (SECRET in spans) is capture
    out, err = capfd.readouterr()
    assert caplog.records  # logging was captured at DEBUG
    assert SECRET not in caplog.text and SECRET not in out and SECRET not in err
