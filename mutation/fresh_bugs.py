"""Bugs written by hand against kvwatch's own engine and server, kept to score the gate.

Each is the smallest realistic mistake a developer could make on a path the
engine or server promises something about (``docs/contracts.md``, Promises):
a text found exactly once in one file, and what it becomes. ``written`` says
how a bug relates to the oracle that catches it: ``with its oracle`` (written
while that oracle was built, to show it works: not a fair test of the gate) or
``held out`` (written by someone who did not build the oracles, before they
were measured). ``miss`` is the cause, for a bug a tier let through, filled in
by whoever reads the run.
"""

from __future__ import annotations

from typing import NamedTuple


class FreshBug(NamedTuple):
    id: str
    file: str  # in the package: engine/cache/storage.py
    find: str  # a text the file holds exactly once
    replace: str
    summary: str
    promise: str  # the promise it breaks (a row of the Promises table, in short)
    written: str  # "with its oracle" or "held out"
    miss: str = ""  # why a tier missed it, once a run did


WITH = "with its oracle"

FRESH: tuple[FreshBug, ...] = (
    FreshBug(
        id="idle-reaper-waits-for-quiet",
        file="server/idle.py",
        find="    closed, sessions = [], engine.open_sessions()  # closing one leaves the others as they are\n",
        replace=(
            "    closed, sessions = [], engine.open_sessions()  # closing one leaves the others as they are\n"
            "    if engine.stats().live_requests:\n"
            "        return closed\n"
        ),
        summary="the idle reaper closes nothing while any request runs",
        promise="--session-idle-timeout closes an unused session, busy server or not",
        written=WITH,
    ),
    FreshBug(
        id="window-restore-reads-padding",
        file="engine/cache/working.py",
        find="read_tokens(snapshot[SWA_WINDOW], self.window - n, n)",
        replace="read_tokens(snapshot[SWA_WINDOW], 0, n)",
        summary="a restore shallower than the window reads the window snapshot's padding",
        promise="a cached request gives the tokens a cache-off engine gives",
        written=WITH,
    ),
    FreshBug(
        id="hang-up-aborts-only-before-output",
        file="server/completions.py",
        find=(
            "    try:\n"
            "        while True:\n"
            "            item = await _next(request, stream)\n"
            "            if item is None:\n"
            "                _abort_soon(request, stream)\n"
            '                return JSONResponse(error_body(400, "client disconnected"), status_code=400)\n'
            "            if isinstance(item, Completion):\n"
        ),
        replace=(
            "    seen = False\n"
            "    try:\n"
            "        while True:\n"
            "            item = await _next(request, stream)\n"
            "            if item is None:\n"
            "                if not seen:\n"
            "                    _abort_soon(request, stream)\n"
            '                return JSONResponse(error_body(400, "client disconnected"), status_code=400)\n'
            "            seen = True\n"
            "            if isinstance(item, Completion):\n"
        ),
        summary="a non-streamed request's hang-up aborts it only while it has produced nothing",
        promise="a client that leaves has its request stopped",
        written=WITH,
    ),
    FreshBug(
        id="host-prune-keeps-pages",
        file="engine/cache/storage.py",
        find=(
            "        taken = self.tree.detach_state(node)\n"
            "        if into is None:\n"
            "            self.free_groups(taken.pages, TREE_OWNER, taken.tier)\n"
        ),
        replace=(
            "        taken = self.tree.detach_state(node)\n"
            '        if into is None and taken.tier is Tier.HOST and reason == "pruned":\n'
            "            pass\n"
            "        elif into is None:\n"
            "            self.free_groups(taken.pages, TREE_OWNER, taken.tier)\n"
        ),
        summary="host-tier cache taken back under pressure is never freed",
        promise="a snapshot on the host tier is loaded back or taken back as cache",
        written=WITH,
    ),
    FreshBug(
        id="session-pages-gauge-reads-requests",
        file="instrumentation/metrics.py",
        find='            "pinned_session": g.by_owner.get("session", 0),\n',
        replace='            "pinned_session": g.by_owner.get("request", 0),\n',
        summary="the pinned_session pool gauge reports the pages requests pin",
        promise="kvwatch_pool_pages says what the probe counts",
        written=WITH,
    ),
    FreshBug(
        id="evictable-without-device-snapshots",
        file="engine/cache/usage.py",
        find=(
            "            for group, pages in snap.pages.items():\n"
            "                evictable[group] += len(pages)\n"
            "        elif snap is not None and snap.tier is Tier.HOST and not node.host_refs:\n"
        ),
        replace=(
            "            pass\n"
            "        elif snap is not None and snap.tier is Tier.HOST and not node.host_refs:\n"
        ),
        summary="the evictable figure leaves out unlocked device snapshots",
        promise="evictable is what a flush frees",
        written=WITH,
    ),
    FreshBug(
        id="abort-counter-skips-decode",
        file="instrumentation/metrics.py",
        find="        self.aborts.add(1, {n.STAGE: e.stage})\n",
        replace=(
            '        if e.stage != "decode":\n            self.aborts.add(1, {n.STAGE: e.stage})\n'
        ),
        summary="the aborts counter loses the aborts of decoding requests",
        promise="kvwatch_aborts_total counts every abort",
        written=WITH,
    ),
    FreshBug(
        id="tokens-counter-skips-first",
        file="instrumentation/metrics.py",
        find="        self.generated.add(e.count, req.key)\n",
        replace="        self.generated.add(e.count - e.first, req.key)\n",
        summary="the tokens-generated counter misses each request's first token",
        promise="kvwatch_tokens_generated_total counts every token",
        written=WITH,
    ),
    FreshBug(
        id="evictable-without-idle-slots",
        file="engine/cache/usage.py",
        find=(
            "    for group, n in cache.stored_evictable().items():  # slot mode: the filled slots\n"
            "        evictable[group] += n\n"
        ),
        replace="",
        summary="in slot mode the evictable figure leaves out the filled slots a flush frees",
        promise="evictable is what a flush frees",
        written="found by its oracle: it was in the engine until gauge truth saw it",
    ),
)
