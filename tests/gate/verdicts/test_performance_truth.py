"""The gate's performance figures against what the server itself saw.

A stand-in OpenAI server holds every completion for a known time and logs,
per request, when it read the request and when it wrote the last byte; its
usage says a quarter of each prompt came from the prefix cache. The gate
runs agentic-trie against it as a black-box target. Its end-to-end
percentiles must fall within one latency bucket (``instrumentation/buckets.py``)
of the server's own, and its hit rate is exactly a quarter: the client
measures what the server did, whatever the machine's speed.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from kvwatch.gate.verdicts.performance import Percentiles, Performance
from kvwatch.harness.plan import PRESETS
from kvwatch.harness.run_record import Timings, merge_timings
from kvwatch.instrumentation import names as n
from kvwatch.instrumentation.buckets import BOUNDS

HOLD_S = 0.12  # every completion takes this long on the server
PROMPT, CACHED, OUTPUT = 40, 10, 3


class Timed(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    held: list[float]  # server-side seconds per completion, per server

    def do_GET(self) -> None:
        if self.path == "/metrics":
            preset = PRESETS["kvwatch"]
            series = {*preset.usage, *preset.busy, *preset.drain} - {*preset.settled}
            self._send("text/plain", "".join(f"{s} 0\n" for s in sorted(series)))
        else:
            self._send("application/json", json.dumps({"object": "list", "data": []}))

    def do_POST(self) -> None:
        begun = time.perf_counter()
        self.rfile.read(int(self.headers.get("content-length", 0)))
        time.sleep(HOLD_S)
        usage = {
            "prompt_tokens": PROMPT,
            "completion_tokens": OUTPUT,
            "total_tokens": PROMPT + OUTPUT,
            "prompt_tokens_details": {"cached_tokens": CACHED},
        }
        body = {
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "a b c"}}],
            "usage": usage,
        }
        self._send("application/json", json.dumps(body))
        self.held.append(time.perf_counter() - begun)

    def _send(self, kind: str, text: str) -> None:
        data = text.encode()
        self.send_response(200)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def timed_server() -> Iterator[tuple[str, list[float]]]:
    held: list[float] = []
    # a deep backlog: with the default 5 a burst of connections waits for SYN retries
    # (a second each), a wait the server never sees and the client rightly counts
    listener = type("Listener", (ThreadingHTTPServer,), {"request_queue_size": 128})
    server = listener(("127.0.0.1", 0), type("TimedServer", (Timed,), {"held": held}))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", held
    finally:
        server.shutdown()
        server.server_close()


def bucket(seconds: float) -> int:
    return bisect.bisect_left(BOUNDS[n.REQUEST_DURATION], seconds)


def test_percentiles_rates_and_hit_rate_of_merged_timings():
    a = Timings(
        e2e_ms=(100.0, 200.0),
        prompt_tokens=30,
        cached_tokens=15,
        output_tokens=4,
        window=(10.0, 12.0),
    )
    b = Timings(
        ttft_ms=(5.0,),
        e2e_ms=(300.0,),
        prompt_tokens=10,
        cached_tokens=5,
        output_tokens=2,
        window=(11.0, 13.0),
    )
    perf = Performance.of(merge_timings([a, b]))
    assert perf.requests == 3 and perf.e2e.p50 == pytest.approx(0.2)
    assert perf.requests_per_s == pytest.approx(1.0) and perf.output_tokens_per_s == 2.0
    assert perf.prefix_hit_rate == 0.5 and perf.ttft == Percentiles(0.005, 0.005, 0.005)
    assert perf.itl is None and "prefix cache hit 50%" in perf.line()
    assert Performance.from_json(perf.as_dict()) == perf._replace(
        requests_per_s=round(perf.requests_per_s, 4)
    )


@pytest.mark.e2e
def test_the_gates_figures_are_what_the_server_saw(tmp_path):
    with timed_server() as (target, held):
        cmd = [sys.executable, "-m", "kvwatch", "gate", "--out", str(tmp_path), "--no-report"]
        cmd += ["--target", target, "--metrics-url", f"{target}/metrics"]
        cmd += ["--profile", "agentic-trie", "-c", "2"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert done.returncode == 0, done.stderr[-3000:]
    perf = summary["runs"][0]["performance"]
    assert perf["requests"] == len(held) > 0
    assert perf["prefix_cache_hit_rate"] == CACHED / PROMPT
    server = np.percentile(held, (50, 90, 99))
    for q, seen in zip(("p50", "p90", "p99"), server, strict=True):
        assert perf["e2e_s"][q] >= seen * 0.99  # a client waits at least what the server took
        assert abs(bucket(perf["e2e_s"][q]) - bucket(seen)) <= 1, (q, perf["e2e_s"], server)
    assert f"{perf['requests_per_s']:.1f} req/s" in done.stdout  # the console's run line
