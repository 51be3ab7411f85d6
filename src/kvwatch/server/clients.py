"""ClientWatch: ASGI middleware that notices a completion's client leaving, on its own.

The completion handlers watch for a disconnect themselves and abort the
request; this middleware watches the same connection independently, so the
``abandoned`` oracle (``departures.py``) does not depend on the code it judges.

Once the request body has reached the app, a task of the middleware waits for
the server's next message, which for an answered request is only ever
``http.disconnect``. It is the one reader of the connection from then on: the
app's later ``receive()`` calls wait for what it saw, so the app sees the
disconnect exactly as it would have. If the client leaves before the
response is complete, every engine request the handler started for it
(``scope["kvwatch.requests"]``) is reported to ``Departures``.

    client ─► RequestLimits (body read, replayed) ─► ClientWatch ─► app
                                                      └ watcher: http.disconnect
                                                          before the response ends
                                                          ─► departures.left(rid)
"""

from __future__ import annotations

import asyncio
import contextlib

from kvwatch.server.departures import Departures

WATCHED = ("/v1/chat/completions", "/v1/completions")
REQUESTS = "kvwatch.requests"  # scope key: the engine request ids a handler started


class ClientWatch:
    def __init__(self, app, departures: Departures) -> None:
        self.app, self.departures = app, departures

    def __getattr__(self, name):  # the wrapped app's attributes (routes, state, ...)
        return getattr(self.app, name)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path") not in WATCHED:
            return await self.app(scope, receive, send)
        scope[REQUESTS] = []
        gone, answered, body_seen = asyncio.Event(), False, False
        watcher: asyncio.Task | None = None

        async def watch() -> None:
            message = await receive()
            if message["type"] == "http.disconnect":
                gone.set()
                if not answered:
                    for rid in scope[REQUESTS]:
                        self.departures.left(rid)

        async def app_receive():
            nonlocal body_seen, watcher
            if not body_seen:
                message = await receive()
                body_seen = message["type"] != "http.request" or not message.get("more_body")
                if body_seen and message["type"] == "http.request":
                    watcher = asyncio.create_task(watch())
                return message
            await gone.wait()
            return {"type": "http.disconnect"}

        async def app_send(message) -> None:
            nonlocal answered
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                answered = True
            await send(message)

        try:
            await self.app(scope, app_receive, app_send)
        finally:
            if watcher is not None and not watcher.done():
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            # uvicorn keeps an idle keep-alive connection's last scope: the ids go
            # with the response, not with the connection
            del scope[REQUESTS]
