"""Suspected SGLang bug (0.5.22, 0.5.23): on a hybrid SSM (mamba) cache, a streaming-session
turn aborted while it waits in the queue is committed to its session as if it had finished.

    .venv/bin/python docs/real-bugs/sglang_queued_abort_mamba.py [VERSION]   (default 0.5.23)
    (VERSION: 0.5.22 or 0.5.23, the releases whose own scheduler kvwatch builds here)

SGLang's own ``Scheduler`` from the release's wheel, built by its own ``__init__`` with
its default settings and stepped one iteration of its event loop at a time
(``loop_choice.make``). The script sends only what a tokenizer manager sends and reads
the scheduler's state between iterations:

1. turn t1 of streaming session ``sess`` finishes: the session slot keeps its KV record
   (and, on the mamba cache, its mamba slot);
2. a plain request x (100 tokens, up to 60 out) runs and holds most of a 200-token KV
   pool;
3. turn t2 arrives: ``_get_new_batch_prefill_raw`` calls ``req.init_next_round_input``
   (the match lends t2 the slot's record, ``holds_mamba`` on the mamba cache) and the
   prefill adder turns it down for memory: t2 stays queued;
4. the client aborts t2 while it waits: ``abort_request`` pops it and, because it holds
   a mamba slot ("For mamba radix cache"), calls ``release_kv_cache(req, tree,
   checkpoint=False)`` -> ``StreamingSession.try_cache_finished_req``; the queued-abort
   path never set ``req.finished_reason``, so the turn is taken for finished:
   ``Session.finish_req(t2)``;
5. once x is done, turn t3 arrives.

On the mamba cache t3's prompt carries the aborted t2's tokens; on a plain (radix) cache
the same messages leave the session at t1. Nothing leaks (the probe finds nothing): the
conversation is wrong. Prints both caches' outcome; exits 1 when the mamba case carries
the aborted tokens, 0 when it does not.
"""

from __future__ import annotations

import os
import sys

from kvwatch.targets.sglang import loop_choice
from kvwatch.targets.sglang.loop_parts import LoopConfig, PoolConfig
from kvwatch.targets.sglang.probe import CacheProbe

T1, T2, T3, X = (list(range(a, b)) for a, b in ((100, 110), (200, 208), (300, 304), (500, 600)))


def config(cache: str) -> LoopConfig:
    pools = PoolConfig(kv_tokens=200, req_slots=8, mamba_slots=16 if cache == "mamba" else None)
    return LoopConfig(pools=pools, streaming=True)


def contains(seq: list[int], part: list[int]) -> bool:
    """Whether ``part`` occurs in ``seq`` as a contiguous run."""
    return any(seq[i : i + len(part)] == part for i in range(len(seq) - len(part) + 1))


def scenario(release, cache: str) -> bool:
    """Whether the next turn's prompt carries the turn aborted while queued."""
    driver = loop_choice.make(release, config(cache))
    probe = CacheProbe(driver)
    driver.open_session("sess")
    driver.submit("t1", T1, 4, session_id="sess")
    driver.run_until_idle()
    driver.submit("x", X, 60)
    driver.step()
    t2 = driver.submit("t2", T2, 60, session_id="sess")
    driver.step()
    waiting = [r.rid for r in driver.waiting_queue]
    print(
        f"  step {driver.step_no}: waiting {waiting}, running "
        f"{[r.rid for r in driver.running_requests()]}; t2 looked at and turned down: "
        f"holds the slot's KV record = {t2.kv.holds_kv}, a mamba slot = {t2.kv.holds_mamba}"
    )
    driver.abort("t2")
    driver.step()
    session = driver.sessions.get("sess")
    print(
        f"  t2 {[o.status for o in driver.outcomes if o.rid == 't2']}; session.req_nodes = "
        f"{list(session.req_nodes)}, in flight = {session._inflight}"
    )
    driver.run_until_idle()
    t3 = driver.submit("t3", T3, 4, session_id="sess")
    driver.step()
    prompt = list(t3.origin_input_ids)
    carried = contains(prompt, T2)
    print(f"  t3's prompt ({len(prompt)} tokens) carries the aborted t2's tokens: {carried}")
    driver.run_until_idle()
    findings = [f.detail[:160] for f in probe.report().findings]
    own = driver.own_reports() or "nothing reported"
    print(f"  probe: {findings or 'no finding'}; SGLang's own idle memory check: {own}")
    driver.close()
    return carried


def main() -> int:
    version = sys.argv[1] if len(sys.argv) > 1 else "0.5.23"
    release = loop_choice.load(version)
    carried = {}
    with release.active():
        for cache in ("radix", "mamba"):
            os.environ.update(loop_choice.environment(release, config(cache)))
            print(f"sglang {version} cache={cache}:")
            carried[cache] = scenario(release, cache)
    return 1 if carried["mamba"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
