"""Suspected SGLang leak (0.5.22, 0.5.23): a mamba slot is orphaned when the first turn of a
streaming session is evicted from the waiting queue by a higher-priority arrival
(``--enable-priority-scheduling`` with ``--max-queued-requests``).

    .venv/bin/python docs/real-bugs/sglang_first_turn_mamba_evict.py [VERSION]   (default 0.5.23)
    (VERSION: 0.5.22 or 0.5.23, the releases whose own scheduler kvwatch builds here)

SGLang's own ``Scheduler`` from the release's wheel, built by its own ``__init__`` with
``--enable-priority-scheduling --max-queued-requests 1`` over a hybrid SSM (mamba) cache
and stepped one iteration of its event loop at a time (``loop_choice.make``). The script
sends only what a tokenizer manager sends and reads the scheduler's state between
iterations:

1. a plain request with prompt P finishes: the tree holds P with a mamba state;
2. a plain request x (150 tokens, up to 60 out) runs and holds most of a 256-token KV pool;
3. the first turn of a new streaming session (P + 3 tokens, priority 0) arrives: the
   scheduler's ``init_next_round_input`` matches P and copies its state into a fresh mamba
   slot (``req.kv.mamba_pool_idx``); the prefill adder turns it down for memory, and
   ``_get_new_batch_prefill_raw`` gives the copied slot back only ``if req.kv.holds_mamba
   and not getattr(req, "session", None)``: a session's turn keeps it; it waits;
4. a request of priority 10 arrives with the queue full: ``_abort_on_queued_limit``
   evicts the waiting turn ("aborted by a higher priority request") with
   ``_release_aborted_request`` and ``waiting_queue.pop``, and no ``release_kv_cache``
   (``abort_request`` has one "For mamba radix cache"), so nothing frees the slot.

Once everything has run, the session is closed and the tree flushed, kvwatch's probe
reports the slot as allocated and held by no one, and so does SGLang's own idle memory
check (``leaked_mamba_pages``). The client's abort of the same waiting turn frees it
(shown for contrast). Exits 1 when the eviction leaks, 0 when it does not.
"""

from __future__ import annotations

import os
import sys

from kvwatch.targets.sglang import loop_choice
from kvwatch.targets.sglang.loop_parts import LoopConfig, PoolConfig
from kvwatch.targets.sglang.probe import CacheProbe

PROMPT = list(range(100, 140))
LOW, HIGH = 0, 10
CONFIG = LoopConfig(
    pools=PoolConfig(kv_tokens=256, req_slots=8, mamba_slots=16),
    streaming=True,
    priority_scheduling=True,
    max_queued_requests=1,
)


def scenario(release, removal: str) -> list[str]:
    """The probe's findings once the turn was removed by ``removal`` and all is idle."""
    driver = loop_choice.make(release, CONFIG)
    probe = CacheProbe(driver)
    driver.submit("warm", PROMPT, 2, priority=LOW)
    driver.run_until_idle()
    driver.submit("x", list(range(1000, 1150)), 60, priority=LOW)
    driver.step()
    driver.open_session("sess")
    turn = driver.submit("sess-t0", [*PROMPT, 7, 8, 9], 30, session_id="sess", priority=LOW)
    driver.step()
    print(
        f"  step {driver.step_no}: waiting {[r.rid for r in driver.waiting_queue]}, running "
        f"{[r.rid for r in driver.running_requests()]}; the turn was matched and turned "
        f"down: holds mamba slot {turn.kv.mamba_pool_idx.item() if turn.kv.holds_mamba else None}"
    )
    if removal == "priority eviction":
        driver.submit("high", list(range(2000, 2010)), 4, priority=HIGH)
    else:
        driver.abort("sess-t0")
    driver.step()
    print(f"  sess-t0: {[(o.status, o.why) for o in driver.outcomes if o.rid == 'sess-t0']}")
    driver.run_until_idle()
    driver.close_session("sess")
    driver.step()
    driver.step()
    driver.flush()
    findings = [f.detail for f in probe.report().findings]
    own = [line for r in driver.own_reports()[:1] for line in r.splitlines() if "mamba" in line]
    print(f"  SGLang's own idle memory check: {own or 'nothing reported'}")
    driver.close()
    return findings


def main() -> int:
    version = sys.argv[1] if len(sys.argv) > 1 else "0.5.23"
    release = loop_choice.load(version)
    os.environ.update(loop_choice.environment(release, CONFIG))
    found = {}
    with release.active():
        for removal in ("abort", "priority eviction"):
            print(f"sglang {version}, first session turn removed by {removal}:")
            found[removal] = scenario(release, removal)
            print(f"  probe: {'; '.join(found[removal]) or 'no finding'}")
    return 1 if found["priority eviction"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
