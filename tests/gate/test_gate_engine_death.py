"""A gate whose engine goes away mid-run reports ``error`` (exit 3), never ``pass``;
one whose engine answers some requests with a 5xx fails (exit 1), never passes.

Embedded: the gate's own ``kvwatch serve`` child is SIGKILLed after the first
turn. Black-box: the target stops answering after the first turn while its
gauges, served from elsewhere, stay flat; they alone would pass the run. And
a black-box target whose gauges stay flat but that answers one request in
seven with a 500 fails on ``requests``.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from kvwatch.harness.plan import PRESETS
from kvwatch.harness.scrape import SERIES

pytestmark = pytest.mark.e2e


def gate_until_first_turn(out: Path, then: Callable[[subprocess.Popen], None], *args: str):
    """Run ``kvwatch gate``; call ``then(gate)`` once turn 0's barrier is reported."""
    cmd = [sys.executable, "-m", "kvwatch", "gate", "--out", str(out), "--no-report", *args]
    gate = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    lines, fired = [], False
    for line in gate.stderr:
        lines.append(line)
        if not fired and "    turn 0:" in line:
            then(gate)
            fired = True
    code = gate.wait(120)
    assert fired, "".join(lines)
    return code, json.loads((out / "summary.json").read_text()), "".join(lines)


def kill_embedded_server(gate: subprocess.Popen) -> None:
    """SIGKILL the ``kvwatch serve`` that ``servers.EngineServer`` started for the gate."""
    (server,) = [p for p in psutil.Process(gate.pid).children() if "serve" in p.cmdline()]
    server.send_signal(signal.SIGKILL)


def test_an_embedded_engine_killed_mid_run_is_an_error(tmp_path):
    code, summary, err = gate_until_first_turn(
        tmp_path, kill_embedded_server, "--profile", "agentic-trie", "-c", "1,2"
    )
    assert code == 3, err[-3000:]
    assert summary["verdict"] == "error"
    first, second = summary["runs"]
    assert "killed by signal 9 during the run" in first["error"]
    assert first["detectors"] == {}  # a record cut short is not judged
    assert second["error"].startswith("not run: ")  # nothing is started against a dead engine


class StandIn(BaseHTTPRequestHandler):
    """A minimal OpenAI chat API and a flat Prometheus page (the kvwatch preset's series)."""

    fail_every = 0  # answer every n-th POST with a 500 (0: never)
    posts = 0

    def do_GET(self) -> None:
        if self.path == "/metrics":
            preset = PRESETS["kvwatch"]
            # The page's own series count is read off the page, not served on it.
            series = {*preset.usage, *preset.busy, *preset.drain} - {SERIES}
            self._send("text/plain", "".join(f"{s} 0\n" for s in sorted(series)))
        else:
            self._send("application/json", json.dumps({"object": "list", "data": []}))

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        type(self).posts += 1
        if self.fail_every and type(self).posts % self.fail_every == 0:
            error = {"error": {"message": "engine step failed", "type": "internal_error"}}
            self._send("application/json", json.dumps(error), status=500)
            return
        body = {
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
        }
        self._send("application/json", json.dumps(body))

    def _send(self, kind: str, text: str, status: int = 200) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def stand_in(fail_every: int = 0) -> Iterator[ThreadingHTTPServer]:
    handler = type("StandInServer", (StandIn,), {"fail_every": fail_every, "posts": 0})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def url(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def test_a_black_box_target_that_goes_away_mid_run_is_an_error(tmp_path):
    with stand_in() as target, stand_in() as metrics:

        def take_target_down(gate: subprocess.Popen) -> None:
            target.shutdown()
            target.server_close()

        code, summary, err = gate_until_first_turn(
            tmp_path,
            take_target_down,
            *("--target", url(target), "--metrics-url", f"{url(metrics)}/metrics"),
            *("--profile", "agentic-trie", "-c", "1"),
        )
    assert code == 3, err[-3000:]
    assert summary["verdict"] == "error"
    assert "stopped answering" in summary["runs"][0]["error"]


@pytest.mark.parametrize("fail_every", [0, 7])
def test_a_black_box_target_that_answers_5xx_fails_on_requests(tmp_path, fail_every):
    """Flat gauges pass gauge-trend either way; the 500s alone fail the gate."""
    with stand_in(fail_every) as target, stand_in() as metrics:
        cmd = [sys.executable, "-m", "kvwatch", "gate", "--out", str(tmp_path), "--no-report"]
        cmd += ["--target", url(target), "--metrics-url", f"{url(metrics)}/metrics"]
        cmd += ["--profile", "agentic-trie", "-c", "1"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    summary = json.loads((tmp_path / "summary.json").read_text())
    (run,) = summary["runs"]
    assert run["detectors"]["gauge-trend"]["verdict"] == "pass", done.stderr[-3000:]
    if not fail_every:
        assert done.returncode == 0 and run["detectors"]["requests"]["verdict"] == "pass"
        return
    assert done.returncode == 1, done.stderr[-3000:]
    verdict = run["detectors"]["requests"]
    assert verdict["verdict"] == "fail" and run["errors"] > 0
    lines = [d["detail"] for d in verdict["details"]]
    assert "answered 5xx" in lines[0]
    assert any("HTTP 500" in line and "engine step failed" in line for line in lines[1:]), lines
    assert "FAIL requests at turn" in done.stdout  # the result names it, with its evidence
