"""Run ``kvwatch serve`` in a subprocess on a port of its own, for end-to-end tests.

The server binds port 0 and prints where it listens (``servers.start_serve``),
so tests running side by side never race for a port; its output goes to a
log file, which a failing start shows.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from kvwatch.processes import ServerError, stop
from kvwatch.targets.kvwatch.serve import start_serve

TOKEN = "test-probe-token"


@contextlib.contextmanager
def kvwatch_server(
    *flags: str, env: dict[str, str] | None = None, log: Path | None = None
) -> Iterator[str]:
    """The server's base URL for the block; ``log`` keeps its output (else a temp file)."""
    with tempfile.TemporaryDirectory(prefix="kvwatch-serve-") as tmp:
        try:
            proc, url = start_serve(list(flags), log or Path(tmp) / "serve.log", env)
        except ServerError as exc:
            raise RuntimeError(str(exc)) from None
        try:
            yield url
        finally:
            stop(proc)


def probe(url: str) -> dict:
    r = httpx.get(f"{url}/debug/probe", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=300)
    r.raise_for_status()
    return r.json()


def wait_idle(url: str, timeout: float = 120) -> dict:
    """The probe once no request is live any more (or the last one, after ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while True:
        report = probe(url)
        if report["live_requests"] == 0 or time.monotonic() > deadline:
            return report
        time.sleep(0.05)
