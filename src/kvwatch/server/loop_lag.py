"""LoopLag: how late the server's event loop ran, for a client judging the server's clock.

A figure the server records (a first token, a request's end) reaches its
client only once the event loop runs the handler that writes it, and a
request reaches the engine only once the loop has read it. On a busy machine
the loop runs late, and the client then measures more than the server saw.
``GET /debug/loop_lag`` (with ``--enable-probe``) answers the worst delay
since the previous call; the first call starts the watch (a task that sleeps
``TICK_S`` at a time and keeps how far past its wake-up it ran), so a server
nobody asks pays nothing.

Invariant: ``take()`` covers every moment since the previous ``take()``, once
the watch runs; it never reports a delay twice.
"""

from __future__ import annotations

import asyncio

TICK_S = 0.002


class LoopLag:
    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task | None = None

    def take(self) -> float:
        """The worst delay since the previous call (0 on the first: the watch starts)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch())
        worst, self.worst = self.worst, 0.0
        return worst

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            slept = loop.time()
            await asyncio.sleep(TICK_S)
            self.worst = max(self.worst, loop.time() - slept - TICK_S)
