"""Suspected SGLang bug (0.5.22, 0.5.23): retracting a streaming-session turn commits it to
its session while it is still queued.

    .venv/bin/python docs/real-bugs/sglang_retract_commits_turn.py [VERSION]   (default 0.5.23)
    (VERSION: 0.5.22 or 0.5.23, the releases whose own scheduler kvwatch builds here)

SGLang's own ``Scheduler`` from the release's wheel (downloaded once, as ``kvwatch gate
--engine sglang-cache`` does), built by its own ``__init__`` and stepped one iteration of
its event loop at a time (``loop_choice.make``). The script sends only what a tokenizer
manager sends (requests, aborts, a session's open and close) and reads the scheduler's
state between iterations:

1. turn t1 of streaming session ``sess`` finishes; the session slot keeps its KV record;
2. a plain request x, then turn t2 (8 new tokens), each up to 100 out, decode together;
   SGLang retracts t2 (the one with fewer tokens out): ``retract_decode`` -> ``release_req``
   -> ``release_kv_cache(req, tree, checkpoint=False)`` ->
   ``StreamingSession.try_cache_finished_req``, which takes t2 for a finished turn and
   calls ``Session.finish_req(t2)``: ``req_nodes`` names t2 and the session is no longer
   in flight, though t2 goes back to the waiting queue unfinished;
3a. the client aborts t2 while it waits: the next turn's prompt carries t2's tokens;
3b. or the session's next turn t3 arrives while t2 waits: ``Session.create_req`` accepts
    it (its "already has an active request" check reads the cleared in-flight flag) and
    builds t3's prompt by extending t2's token arrays in place, so t2's own prompt now
    holds its output and t3's tokens.

The retraction comes two ways, each case on a scheduler of its own: with default
settings on a 264-token KV pool too small for t2 and x to finish ("KV cache pool is full.
Retract requests."; t2's record stays in the session slot, so retracting it frees none
of its KV and SGLang then aborts x as out of memory), and with room to spare under
SGLang's own test switch ``SGLANG_TEST_RETRACT`` (every 3rd decode step). Under memory pressure, 3b
leaves t2 and t3 waiting with nothing running until their clients give up (the prefill
adder stops at t2, whose rewritten prompt no longer fits); under the test switch, t2 and
t3 borrow the slot's one KV record and run together on one ``req_to_token`` row, and once
both finish and the session is closed KV units are held by no one (kvwatch's probe and
SGLang's own idle memory check both report it).

Prints what each case shows (SGLang's own log lines included); exits 1 when the bug
shows in any case (3a: the aborted tokens carried; 3b: t3 accepted), 0 when in none.
"""

from __future__ import annotations

import logging
import os
import sys

from kvwatch.targets.sglang import loop_choice
from kvwatch.targets.sglang.loop_parts import LoopConfig, PoolConfig
from kvwatch.targets.sglang.probe import CacheProbe

HISTORY, T2, T3 = list(range(100, 160)), list(range(200, 208)), list(range(300, 304))
X = list(range(400, 410))
# a KV pool too small for t2 and x to finish: SGLang retracts because memory ran out
PRESSURE = LoopConfig(pools=PoolConfig(kv_tokens=264, req_slots=8), streaming=True)
# room to spare, and SGLANG_TEST_RETRACT: SGLang's own test switch retracts every 3rd decode
TEST_RETRACT = LoopConfig(
    pools=PoolConfig(kv_tokens=1024, req_slots=8), streaming=True, retract_every=3
)
MAX_STEPS = 400
GIVE_UP = 64  # iterations with requests waiting and none running: the clients abort


def contains(seq: list[int], part: list[int]) -> bool:
    """Whether ``part`` occurs in ``seq`` as a contiguous run."""
    return any(seq[i : i + len(part)] == part for i in range(len(seq) - len(part) + 1))


def retracted_t2(release, config: LoopConfig):
    """A scheduler whose session ``sess`` has t2 retracted and queued, its probe, and
    whether SGLang retracted t2 at all."""
    driver = loop_choice.make(release, config)
    probe = CacheProbe(driver)
    driver.open_session("sess")
    driver.submit("t1", HISTORY, 4, session_id="sess")
    driver.run_until_idle()
    driver.submit("x", X, 100)
    driver.step()  # x runs first, so t2 has the fewer tokens out: retracted first
    driver.submit("t2", T2, 100, session_id="sess")
    for _ in range(MAX_STEPS):
        driver.step()
        if any(r.rid == "t2" and r.is_retracted for r in driver.waiting_queue):
            break
    else:
        print(f"  t2 was never retracted: {[(o.rid, o.status) for o in driver.outcomes]}")
        return driver, probe, False
    session = driver.sessions.get("sess")
    print(
        f"  step {driver.step_no}: t2 retracted and queued; session.req_nodes = "
        f"{list(session.req_nodes)}, in flight = {session._inflight}; "
        f"running {[r.rid for r in driver.running_requests()]}"
    )
    return driver, probe, True


def aborted(release, config: LoopConfig) -> bool:
    """The client aborts the retracted t2 while it waits, then sends t3."""
    driver, _, retracted = retracted_t2(release, config)
    if not retracted:
        driver.close()
        return False
    driver.abort("t2")
    driver.run_until_idle()
    t3 = driver.submit("t3", T3, 4, session_id="sess")
    driver.step()
    prompt = list(t3.origin_input_ids)
    carried = contains(prompt, T2)
    print(
        f"  t2 {[o.status for o in driver.outcomes if o.rid == 't2']}; the next turn t3's "
        f"prompt ({len(prompt)} tokens) carries the aborted t2's {len(T2)} tokens: {carried}"
    )
    driver.run_until_idle()
    driver.close()
    return carried


def concurrent(release, config: LoopConfig) -> bool:
    """t3 arrives while the retracted t2 waits: SGLang should refuse it."""
    driver, probe, retracted = retracted_t2(release, config)
    if not retracted:
        driver.close()
        return False
    t2 = driver.handles["t2"]
    driver.submit("t3", T3, 4, session_id="sess")
    driver.step()
    print(
        f"  t3 sent while t2 waits; t2's prompt now carries t3's tokens: "
        f"{contains(list(t2.origin_input_ids), T3)}"
    )
    first, waited = (), 0
    while not driver.idle() and driver.step_no < MAX_STEPS * 2:
        waited = waited + 1 if not driver.running_requests() else 0
        if waited == GIVE_UP:
            print(
                f"  step {driver.step_no}: {[r.rid for r in driver.waiting_queue]} waited "
                f"{GIVE_UP} iterations with nothing running and "
                f"{driver.sched.token_to_kv_pool_allocator.available_size()} KV tokens "
                "free; the clients abort them"
            )
            for req in driver.live_requests():
                driver.abort(req.rid)
        driver.step()
        if not first and (first := probe.report().findings):
            print(f"  step {driver.step_no}, while both are live: {first[0].detail[:150]}")
    print(f"  outcomes: {[(o.rid, o.status) for o in driver.outcomes]}")
    refused = [o.why for o in driver.outcomes if o.rid == "t3" and "active request" in o.why]
    print(f"  t3 refused as the session's second active request: {refused or False}")
    driver.close_session("sess")
    driver.step()
    driver.flush()
    findings = probe.report().findings
    for f in findings[:3]:
        print(f"  session closed, cache flushed: {f.detail[:200]}")
    print(f"  SGLang's own idle memory check: {driver.own_reports()[:2] or 'nothing reported'}")
    driver.close()
    return not refused


CASES = (
    ("memory full, t2 aborted while queued", PRESSURE, aborted),
    ("memory full, next turn while t2 is queued", PRESSURE, concurrent),
    ("SGLANG_TEST_RETRACT, next turn while t2 is queued", TEST_RETRACT, concurrent),
)


def quiet_test_retractions() -> None:
    """SGLANG_TEST_RETRACT logs every forced retraction: keep only the first lines."""
    seen = []

    def first_three(record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith("Testing retraction"):
            return True
        seen.append(record)
        return len(seen) <= 3

    logging.getLogger("sglang.srt.managers.scheduler").addFilter(first_three)


def main() -> int:
    quiet_test_retractions()
    version = sys.argv[1] if len(sys.argv) > 1 else "0.5.23"
    release = loop_choice.load(version)
    shown = []
    with release.active():
        for case, config, run in CASES:
            os.environ.update(loop_choice.environment(release, config))
            print(f"sglang {version}, {case}:")
            shown.append(run(release, config))
    return 1 if any(shown) else 0


if __name__ == "__main__":
    raise SystemExit(main())
