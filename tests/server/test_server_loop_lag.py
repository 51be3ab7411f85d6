"""LoopLag: the event loop's worst delay since the last read, once asked.

A handler that blocks the loop for 50 ms shows as a delay of at least that
much at the next read, and the read after it no longer reports it. The
bound is one-sided: a busy machine only adds delay, so nothing here depends
on its speed.
"""

from __future__ import annotations

import asyncio
import time

from kvwatch.server.loop_lag import TICK_S, LoopLag

BLOCK_S = 0.05


def test_a_blocked_loop_shows_once_at_the_next_read():
    async def scenario() -> tuple[float, float, float]:
        lag = LoopLag()
        first = lag.take()  # starts the watch
        await asyncio.sleep(4 * TICK_S)  # the watch is sleeping when the block begins
        time.sleep(BLOCK_S)  # a handler that blocks the loop
        await asyncio.sleep(4 * TICK_S)
        blocked = lag.take()
        after = lag.take()
        lag.stop()
        return first, blocked, after

    first, blocked, after = asyncio.run(scenario())
    assert first == 0.0
    assert blocked >= BLOCK_S - 2 * TICK_S, blocked
    assert after == 0.0  # a delay is reported once
