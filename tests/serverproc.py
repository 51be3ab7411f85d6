"""Run ``kvwatch serve`` in a subprocess on a free loopback port, for end-to-end tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx

from kvwatch.loadtests.servers import ServerError, free_port, wait_healthy

TOKEN = "test-probe-token"


@contextlib.contextmanager
def kvwatch_server(*flags: str, env: dict[str, str] | None = None) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "kvwatch", "serve", "--port", str(port), *flags]
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_healthy(url, proc, 60)
        except ServerError as exc:
            output = proc.stdout.read() if proc.poll() is not None else ""
            raise RuntimeError(f"{exc}: {output}") from None
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def probe(url: str) -> dict:
    r = httpx.get(f"{url}/debug/probe", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    r.raise_for_status()
    return r.json()


def wait_idle(url: str, timeout: float = 30) -> dict:
    """The probe once no request is live any more."""
    deadline = time.monotonic() + timeout
    while True:
        report = probe(url)
        if report["live_requests"] == 0 or time.monotonic() > deadline:
            return report
        time.sleep(0.05)
