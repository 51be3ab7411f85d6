"""The HTTP client side of the ``kvwatch-http`` history target: connections and calls.

``Connections`` keeps keep-alive connections to one server: a request takes
an idle one where there is one (it may have idled for many steps) and the
server has not closed it, and gives it back once its response was read
whole; a client that leaves closes its connection, as a client process that
gives up does, and only while the call still owns its connection (once over,
the connection may be back in the pool carrying another request). A request
is sent once: a POST the server may have begun to serve is never sent again.

``Call`` is one completion request on a thread of its own, streamed (SSE,
``return_token_ids``: every chunk carries its token ids) or not, reading what
a client reads: the status, the token ids it was sent, the finish reason or
the error. ``leave()`` drops the connection from under it, wherever the
request is.

Invariant: every connection is either in the idle pool or held by exactly one
call; a connection whose response was not read to its end is never reused.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import select
import socket
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit


class Connections:
    def __init__(self, url: str, timeout: float = 300.0) -> None:
        parts = urlsplit(url)
        self.host, self.port, self.timeout = parts.hostname or "127.0.0.1", parts.port, timeout
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self.opened = 0  # connections made (fewer than requests: keep-alive reuse)

    def take(self) -> http.client.HTTPConnection:
        """An idle connection the server has not closed, else a new one. A request is
        never sent twice: once sent, the server may be serving it (a POST is not
        idempotent), so a connection is checked before it is used, as urllib3 does."""
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
                if conn is None:
                    self.opened += 1
                    return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            if conn.sock is not None and not _dropped(conn.sock):
                return conn
            conn.close()

    def give(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._idle.append(conn)

    def send(
        self,
        method: str,
        path: str,
        body: str | None,
        headers: dict[str, str],
        hold: Callable[[http.client.HTTPConnection], None] = lambda conn: None,
        timeout: float | None = None,
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """The request on a live connection (handed to ``hold`` before it is used), and
        the response's head; a failure is the caller's, never retried."""
        conn = self.take()
        hold(conn)
        try:
            conn.request(method, path, body=body, headers=headers)
            conn.sock.settimeout(timeout or self.timeout)
            return conn, conn.getresponse()
        except (OSError, http.client.HTTPException):
            conn.close()
            raise

    def json(
        self, method: str, path: str, body: Any = None, timeout: float | None = None
    ) -> tuple[int, Any]:
        """One request on a pooled connection, its status and JSON body; ``timeout``: the
        longest the answer may take (a ``TimeoutError`` past it)."""
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn, resp = self.send(method, path, data, headers, timeout=timeout)
        try:
            raw = resp.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            raise
        self.give(conn)
        return resp.status, json.loads(raw) if raw else None

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class Call:
    """One completion request, sent and read on its own thread."""

    def __init__(self, pool: Connections, rid: str, body: dict[str, Any]) -> None:
        self.pool, self.rid, self.body = pool, rid, body
        self.streamed = bool(body.get("stream"))
        self.status: int | None = None  # the HTTP status, once the response began
        self.tokens: list[int] = []  # the generated token ids received so far
        self.prompt_ids: list[int] | None = None  # what the server says it computed over
        self.cached: int | None = None  # usage.prompt_tokens_details.cached_tokens
        self.finish_reason: str | None = None
        self.error = ""
        self.left = False  # the client gave up and closed its connection
        self.reused = False  # sent on a kept-alive connection
        self.done = threading.Event()
        self._owning = threading.Lock()  # the connection is this call's until done
        self._conn: http.client.HTTPConnection | None = None
        self._thread = threading.Thread(target=self._run, name=f"call-{rid}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        whole, resp = False, None
        try:
            headers = {"Content-Type": "application/json", "X-Request-Id": self.rid}
            _, resp = self.pool.send(
                "POST", "/v1/completions", json.dumps(self.body), headers, self._hold
            )
            self.status = resp.status
            if resp.status == 200 and self.streamed:
                self._read_events(resp)
            else:
                self._read_body(resp.status, json.loads(resp.read() or b"null"))
            whole = True
        except Exception as exc:  # a client that left reads a torn connection
            if not self.left:
                self.error = f"the connection broke: {exc!r}"
        finally:
            with self._owning:  # a leave() from now on finds the call over
                conn, self._conn = self._conn, None
                keep = whole and not self.left and resp is not None and not resp.will_close
                self.done.set()
            if conn is not None and keep:
                self.pool.give(conn)
            elif conn is not None:
                conn.close()

    def _read_body(self, status: int, data: Any) -> None:
        if status != 200:
            error = (data or {}).get("error", {}) if isinstance(data, dict) else {}
            self.error = f"{status} {error.get('code', '')}: {error.get('message', data)}"
            return
        choice = data["choices"][0]
        self.tokens = list(choice.get("token_ids", []))
        self.prompt_ids = data.get("prompt_token_ids")
        self.cached = data["usage"]["prompt_tokens_details"]["cached_tokens"]
        self.finish_reason = choice["finish_reason"]

    def _read_events(self, resp: http.client.HTTPResponse) -> None:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: ") :])
            if "error" in event:
                error = event["error"]
                self.error = f"in the stream: {error.get('code', '')}: {error.get('message')}"
                continue
            if not event["choices"]:  # the usage chunk
                self.cached = event["usage"]["prompt_tokens_details"]["cached_tokens"]
                continue
            choice = event["choices"][0]
            self.tokens.extend(choice.get("token_ids", []))
            if "prompt_token_ids" in event:
                self.prompt_ids = event["prompt_token_ids"]
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def describe(self) -> str:
        """Where the client is, for a finding: what it sent, what it has read."""
        kind = "streamed" if self.streamed else "not streamed"
        return (
            f"{kind}, connection {'reused' if self.reused else 'new'}, status {self.status}, "
            f"{len(self.tokens)} token ids read, finish {self.finish_reason}, error {self.error!r}"
        )

    def _hold(self, conn: http.client.HTTPConnection) -> None:
        self._conn = conn
        self.reused = conn.sock is not None

    def leave(self) -> None:
        """The client gives up: its connection closes under the request. Once the call
        is over its connection is no longer its own (it may be back in the pool, carrying
        another request), so nothing is closed then."""
        with self._owning:
            if self.done.is_set():
                return
            self.left = True
            conn = self._conn
        if conn is None:  # not sent yet (submit waits until the server has it)
            return
        with contextlib.suppress(OSError):
            if conn.sock is not None:
                conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()

    def wait(self, timeout: float) -> bool:
        return self.done.wait(timeout)


def _dropped(sock: socket.socket) -> bool:
    """Whether the server closed an idle connection: readable at once means EOF (or a
    stray byte), and either way the connection cannot carry a request."""
    return bool(select.select([sock], [], [], 0)[0])
