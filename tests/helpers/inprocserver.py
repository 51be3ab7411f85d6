"""Serve an app with uvicorn in a thread of the test process, on a free loopback port.

Unlike ``serverproc.py`` (a ``kvwatch serve`` child), the test keeps its hands
on the engine: it can hold a step at a chosen point while a real HTTP client
disconnects. uvicorn runs with the same settings ``kvwatch serve`` gives it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import httpx
import uvicorn

from kvwatch.serve import ServeOptions, uvicorn_options
from kvwatch.sockets import listen_socket, socket_url


@contextlib.contextmanager
def serving(app, options: ServeOptions | None = None) -> Iterator[str]:
    """uvicorn serving ``app`` on a loopback port of its own (bound first, port 0)."""
    options = options or ServeOptions()
    sock = listen_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, **uvicorn_options(options)))
    thread = threading.Thread(target=server.run, args=([sock],), name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield socket_url(sock)
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def metric(url: str, name: str, **labels: str) -> float:
    """A Prometheus counter or gauge from ``url/metrics``, summed over matching series."""
    total = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=300).text.splitlines():
        if line.startswith(f"{name}{{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total
