"""How kvwatch's server runs under uvicorn: the settings ``kvwatch serve`` gives it.

One place for them, so a server started in a thread (the history tier's
``kvwatch-http`` target, tests) runs exactly as ``kvwatch serve`` runs it.
"""

from __future__ import annotations

from typing import Any

# uvicorn buffers at most this many times ``max_header_bytes`` of a request's
# head (request line and headers) and answers a plain 400 beyond it; below it
# the app's own check answers oversized headers with a JSON 431.
HEAD_BUFFER_FACTOR = 4
# How long an idle keep-alive connection stays open (uvicorn's default is 5 s).
# A client that sends on a connection just as the server closes it gets no
# answer; agents pause between turns for longer than 5 s on a loaded machine.
KEEP_ALIVE_S = 75


def uvicorn_settings(host: str, port: int, log_level: str, max_header_bytes: int) -> dict[str, Any]:
    """uvicorn's settings: a bounded request head, and idle keep-alive connections kept
    for ``KEEP_ALIVE_S``.

    The h11 protocol is named explicitly: it is the implementation whose head
    buffer ``h11_max_incomplete_event_size`` bounds.
    """
    return {
        "host": host,
        "port": port,
        "log_level": log_level,
        "http": "h11",
        "h11_max_incomplete_event_size": HEAD_BUFFER_FACTOR * max_header_bytes,
        "timeout_keep_alive": KEEP_ALIVE_S,
    }
