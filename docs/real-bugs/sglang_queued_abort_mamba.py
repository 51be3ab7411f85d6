"""Suspected SGLang bug (0.5.11 .. 0.5.23): on a hybrid SSM (mamba) cache, a streaming-session
turn aborted while it waits in the queue is committed to its session as if it had finished.

    .venv/bin/python docs/real-bugs/sglang_queued_abort_mamba.py [VERSION]   (default 0.5.23)
    (VERSION: 0.5.22 or later, the releases kvwatch's checkpoint shim plays)

SGLang's own classes from the release's wheel, driven by hand in its scheduler's order:

1. turn t1 finishes: the session slot keeps its KV record and mamba slot;
2. turn t2 is looked at once and not admitted: ``req.init_next_round_input(tree_cache)``
   lends it the slot's record (``holds_mamba``);
3. the client aborts t2 while queued: ``abort_request`` pops it and, because it holds a
   mamba slot ("For mamba radix cache"), calls ``release_kv_cache(req, tree, checkpoint=False)``
   -> ``StreamingSession.try_cache_finished_req``; the queued-abort path never set
   ``req.finished_reason``, so the turn is taken for finished: ``Session.finish_req(t2)``.

The next turn's prompt then carries t2's tokens. The same abort on a plain (radix) cache
leaves the session at t1. Nothing leaks (no pool finding): the conversation is wrong.
Prints both caches' outcome; exits 1 when the mamba case carries the aborted tokens.
"""

from __future__ import annotations

import sys

from kvwatch.targets.sglang import shim_choice
from kvwatch.targets.sglang.release_import import load
from kvwatch.targets.sglang.shim_parts import PoolConfig, ShimConfig

T2 = list(range(200, 208))


def scenario(release, cache: str) -> tuple[list[str], int]:
    pools = PoolConfig(kv_tokens=512, req_slots=8, mamba_slots=16 if cache == "mamba" else None)
    shim = shim_choice.make(release, ShimConfig(pools=pools, streaming=True))
    shim.open_session("sess")
    shim.submit("t1", list(range(100, 110)), 4, session_id="sess")
    shim.run_until_idle()
    t2 = shim.submit("t2", T2, 4, session_id="sess")
    t2.init_next_round_input(shim.tree_cache)  # looked at once, not admitted
    shim.abort("t2")
    session = shim.sessions.get("sess")
    t3 = shim.submit("t3", list(range(300, 304)), 4, session_id="sess")
    return list(session.req_nodes), sum(1 for t in t3.origin_input_ids if t in T2)


def main() -> int:
    version = sys.argv[1] if len(sys.argv) > 1 else "0.5.23"
    release = load(version)
    carried = {}
    with release.active():
        for cache in ("radix", "mamba"):
            nodes, carried[cache] = scenario(release, cache)
            print(
                f"sglang {version} cache={cache}: session.req_nodes after the queued abort = "
                f"{nodes}; the next turn's prompt carries {carried[cache]} of t2's {len(T2)} tokens"
            )
    return 1 if carried["mamba"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
