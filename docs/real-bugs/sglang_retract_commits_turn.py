"""Suspected SGLang bug (0.5.11 .. 0.5.23): retracting a streaming-session turn commits it to
its session while it is still queued.

    .venv/bin/python docs/real-bugs/sglang_retract_commits_turn.py [VERSION]   (default 0.5.23)
    (VERSION: 0.5.22 or later, the releases kvwatch's checkpoint shim plays)

SGLang's own classes from the release's wheel (downloaded once, as ``kvwatch gate
--engine sglang-cache`` does), driven by hand in the order its scheduler calls them:

1. turn t1 of session ``sess`` finishes; the session slot keeps its KV record;
2. turn t2 and a plain request x decode together; the release's own
   ``ScheduleBatch.retract_decode`` retracts t2: ``release_req`` ->
   ``release_kv_cache(req, tree, checkpoint=False)`` -> ``StreamingSession.try_cache_finished_req``,
   which takes t2 for a finished turn and calls ``Session.finish_req(t2)``: ``req_nodes`` names
   t2 and the session is no longer in flight, though t2 goes back to the queue unfinished;
3a. the client aborts t2 while it waits: the next turn's prompt carries t2's tokens;
3b. or the next turn t3 arrives while t2 waits: it is accepted, t2 and t3 borrow the slot's
    one KV record and run together, and the probe finds pages freed while a tree node holds
    them and pages no one holds.

Prints what each case shows; exits 1 when the bug shows, 0 when it does not.
"""

from __future__ import annotations

import sys

from kvwatch.targets.sglang import shim_choice
from kvwatch.targets.sglang.cache_probe import CacheProbe
from kvwatch.targets.sglang.release_import import load
from kvwatch.targets.sglang.shim_parts import PoolConfig, ShimConfig

HISTORY, T2, T3 = list(range(100, 160)), list(range(200, 208)), list(range(300, 304))
CONFIG = ShimConfig(pools=PoolConfig(kv_tokens=1024, req_slots=8), streaming=True)


def retracted_t2(release):
    """A shim whose session ``sess`` has t2 retracted and queued; the shim, its probe, t2."""
    shim = shim_choice.make(release, CONFIG)
    probe = CacheProbe(shim)
    shim.open_session("sess")
    shim.submit("t1", HISTORY, 4, session_id="sess")
    shim.run_until_idle()
    t2 = shim.submit("t2", T2, 30, session_id="sess")
    shim.submit("x", list(range(400, 410)), 30)
    while len(t2.output_ids) < 3:
        shim.step()
    args = [shim.server_args] if hasattr(shim, "server_args") else []
    answer = shim.running_batch.retract_decode(*args)
    assert answer[0] == [t2], f"retracted {[r.rid for r in answer[0]]}, not t2"
    shim.queue(t2)  # _add_request_to_queue(req, is_retracted=True)
    session = shim.sessions.get("sess")
    print(
        f"  after the retraction: t2 queued, session.req_nodes = {list(session.req_nodes)}, "
        f"in flight = {getattr(session, '_inflight', 'n/a')}"
    )
    return shim, probe, t2


def aborted(release) -> bool:
    shim, _, _ = retracted_t2(release)
    shim.abort("t2")
    shim.run_until_idle()
    t3 = shim.submit("t3", T3, 4, session_id="sess")
    carried = sum(1 for t in t3.origin_input_ids if t in T2)
    print(f"  t2 aborted while queued; t3's prompt carries {carried} of t2's {len(T2)} tokens")
    return carried > 0


def concurrent(release) -> bool:
    shim, probe, _ = retracted_t2(release)
    t3 = shim.submit("t3", T3, 4, session_id="sess")
    print(f"  t3 submitted while t2 waits: accepted = {t3.finished_reason is None}")
    shim.run_until_idle()
    findings = probe.report().findings
    for f in findings[:3]:
        print(f"  finding: {f.detail[:200]}")
    return bool(findings)


def main() -> int:
    version = sys.argv[1] if len(sys.argv) > 1 else "0.5.23"
    release = load(version)
    shown = []
    with release.active():
        for case, run in (("abort while queued", aborted), ("next turn while queued", concurrent)):
            print(f"sglang {version}, {case}:")
            try:
                shown.append(run(release))
            except Exception as exc:  # older releases raise inside SGLang on case b
                print(f"  SGLang raised {type(exc).__name__}: {exc}")
                shown.append(True)
    return 1 if any(shown) else 0


if __name__ == "__main__":
    raise SystemExit(main())
