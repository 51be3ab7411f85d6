"""Child processes on loopback: a free port, waiting until one is healthy, stopping one.

Every server kvwatch starts for a gate (``kvwatch serve``, vLLM, Locust's
master) is a child process bound to 127.0.0.1; these are the pieces they
share. ``ServerError`` is what a server that does not come up, or exits,
raises: the gate turns it into a broken run (exit 3), never a pass.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from urllib.parse import urlparse

import httpx


class ServerError(RuntimeError):
    """A server did not come up, or exited while it was needed."""


def free_port() -> int:
    """A port that was free a moment ago, for programs that cannot bind port 0
    and say which port they got (Locust's master, vLLM)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(
    url: str, proc: subprocess.Popen, timeout: float, name: str = "kvwatch serve"
) -> None:
    """Until ``url/health`` answers 200; ServerError if the process exits or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise ServerError(f"{name} exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=10).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise ServerError(f"{name} did not come up in {timeout:.0f} s")
        time.sleep(0.1)


def stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGINT (a clean shutdown), then SIGKILL after ``grace`` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def is_http_url(url: str) -> bool:
    """Whether ``url`` is an http(s) address with a host: what a URL flag takes."""
    parts = urlparse(url)
    return parts.scheme in ("http", "https") and bool(parts.netloc)
