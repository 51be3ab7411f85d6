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
        file="engine/cache/sliding_window.py",
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
        id="prefill-counter-counts-chunk-end",
        file="instrumentation/metrics.py",
        find="        self.computed.add(e.tokens)\n",
        replace="        self.computed.add(e.start + e.tokens)\n",
        summary="the prefill-computed counter adds where each chunk ends, not how many tokens it ran",
        promise="kvwatch_prefill_computed_tokens_total counts the prompt tokens computed",
        written=WITH,
    ),
    FreshBug(
        id="slot-evictions-counted-as-nodes",
        file="instrumentation/metrics.py",
        find='        self.evictions.add(1, {n.KIND: "slot"})\n',
        replace='        self.evictions.add(1, {n.KIND: "node"})\n',
        summary="the evictions counter files each evicted slot under kind node",
        promise="kvwatch_evictions_total counts each eviction by its kind",
        written=WITH,
    ),
    FreshBug(
        id="ttft-recorded-in-milliseconds",
        file="instrumentation/metrics.py",
        find="            self.ttft.record(req.first - req.added, req.attrs)\n",
        replace="            self.ttft.record((req.first - req.added) * 1000, req.attrs)\n",
        summary="the time-to-first-token histogram is recorded in milliseconds",
        promise="the latency histograms never say more than the client measured",
        written=WITH,
    ),
    FreshBug(
        id="flush-refused-only-while-running",
        file="server/debug.py",
        find="        if engine.has_unfinished() or engine.request_ids(Status.PAUSED):\n",
        replace="        if engine.stats().queue.running:\n",
        summary="a cache flush is refused only while a request runs, not while one waits or is paused",
        promise="POST /debug/flush_cache while requests run answers 409",
        written=WITH,
    ),
    FreshBug(
        id="evictable-without-idle-slots",
        file="engine/cache/usage.py",
        find=(
            "    for group, n in view.stored.evictable().items():  # slot mode: the filled slots\n"
            "        evictable[group] += n\n"
        ),
        replace="",
        summary="in slot mode the evictable figure leaves out the filled slots a flush frees",
        promise="evictable is what a flush frees",
        written="found by its oracle: it was in the engine until gauge truth saw it",
    ),
    FreshBug(
        id="abort-skips-parked-requests",
        file="engine/engine.py",
        find=(
            "            req = self._requests.get(rid)\n"
            "            if req is not None and not req.done:\n"
            "                self._scheduler.abort(req)\n"
        ),
        replace=(
            "            req = self._requests.get(rid)\n"
            "            if req is not None and req.status in (Status.WAITING, Status.RUNNING):\n"
            "                self._scheduler.abort(req)\n"
        ),
        summary="an abort of a retracted or paused request is dropped: it comes back and runs on",
        promise="a client that leaves has its request stopped",
        written="held out",
    ),
    FreshBug(
        id="cut-turn-stays-in-flight",
        file="engine/records.py",
        find=(
            "        self.in_flight = None\n"
            "        if not record:\n"
            "            if not req.admitted and not self.keep_unrun_turn:\n"
            "                del self.tokens[self.turn_start :]\n"
            "            return\n"
        ),
        replace=(
            "        if not record:\n"
            "            if not req.admitted and not self.keep_unrun_turn:\n"
            "                del self.tokens[self.turn_start :]\n"
            "            return\n"
            "        self.in_flight = None\n"
        ),
        summary="an aborted or failed session turn leaves its session busy for good",
        promise="once clients stop, the engine gets idle: no request or session left",
        written="held out",
    ),
    FreshBug(
        id="engine-refusals-answered-as-bad-prompt",
        file="server/completions.py",
        find=(
            "    except (ApiError, EngineError):  # answered by their handlers (errors.py)\n"
            "        raise\n"
        ),
        replace="    except ApiError:  # answered by its handler (errors.py)\n        raise\n",
        summary="a turn on a closed, busy or unknown session answers 400 invalid_prompt",
        promise="a session call on a closed session answers 409 session_closed; during a turn, 409 session_busy",
        written="held out",
        miss=(
            "no load sent a turn to a busy or a closed session: the 409s were read only from "
            "GET and DELETE. The edges load now sends both (caught there since; this row keeps "
            "the first run)"
        ),
    ),
    FreshBug(
        id="retracted-release-keeps-host-ref",
        file="engine/cache/base.py",
        find=(
            "            anchor, holder.anchor = holder.anchor, None\n"
            "            self._store.tree.drop_host_ref(anchor)\n"
        ),
        replace="            anchor, holder.anchor = holder.anchor, None\n",
        summary="a request aborted while retracted keeps its host ref on its recovery node",
        promise="a snapshot on the host tier is loaded back or taken back as cache",
        written="held out",
    ),
    FreshBug(
        id="trim-frees-partly-kept-page",
        file="engine/cache/full_attention.py",
        find="        keep_pages = math.ceil(keep_len / self.page_size)\n",
        replace="        keep_pages = keep_len // self.page_size\n",
        summary="trimming rejected drafts frees the page that still holds the last accepted tokens",
        promise="a cached request gives the tokens a cache-off engine gives",
        written="held out",
    ),
    FreshBug(
        id="host-gauge-counts-host-cache",
        file="instrumentation/metrics.py",
        find='            "host": g.by_owner.get("host", 0) - g.by_owner.get("host_evictable", 0),\n',
        replace='            "host": g.by_owner.get("host", 0),\n',
        summary="the host pool gauge counts host-tier cache as pinned too, so it is counted twice",
        promise="kvwatch_pool_pages says what the probe counts",
        written="held out",
    ),
    FreshBug(
        id="mid-step-abort-ends-stream-early",
        file="server/worker.py",
        find=(
            "        if self.engine.abort(request_id) and not self.engine.in_step:\n"
            "            self._finish(request_id)\n"
        ),
        replace="        if self.engine.abort(request_id):\n            self._finish(request_id)\n",
        summary="an abort inside a step drops the stream before the request ends: it is never taken",
        promise="a stream ends with [DONE] or an error event",
        written="held out",
    ),
    FreshBug(
        id="session-close-touches-clock",
        file="server/session_routes.py",
        find="    _clock(request).forget(session_id)\n",
        replace="    _clock(request).touch(session_id)\n",
        summary="closing a session over HTTP counts as a use: the idle clock keeps its entry",
        promise="a session's pages, slot and records end with its close",
        written="held out",
    ),
    FreshBug(
        id="failed-admission-unlocks-only-anchor",
        file="engine/cache/radix_backend.py",
        find=(
            "            if anchor is not None:\n"
            "                tree.unlock(anchor)\n"
            "            raise\n"
        ),
        replace=(
            "            if anchor is not None:\n"
            "                tree.dec(anchor)\n"
            "            raise\n"
        ),
        summary="an admission that finds no working pages gives back the anchor's ref but not its path's",
        promise="a request's pages, refs and per-request state end with it",
        written="held out",
    ),
    FreshBug(
        id="rollback-settles-before-cut",
        file="engine/engine.py",
        find=(
            "        del session.tokens[session.turn_ends[-1 - steps] :]\n"
            "        del session.turn_ends[-steps:]\n"
            "        if session.records is not None:\n"
            "            session.records.rollback(steps)\n"
            "        if session.holder is not None:  # the slot's state must not outrun its tokens\n"
            "            self._cache.settle(session.holder, len(session.tokens))\n"
        ),
        replace=(
            "        if session.holder is not None:  # the slot's state must not outrun its tokens\n"
            "            self._cache.settle(session.holder, len(session.tokens))\n"
            "        del session.tokens[session.turn_ends[-1 - steps] :]\n"
            "        del session.turn_ends[-steps:]\n"
            "        if session.records is not None:\n"
            "            session.records.rollback(steps)\n"
        ),
        summary="a rollback settles the session slot before cutting its tokens: the slot keeps the undone turn",
        promise="a cached request gives the tokens a cache-off engine gives",
        written="held out",
    ),
)
