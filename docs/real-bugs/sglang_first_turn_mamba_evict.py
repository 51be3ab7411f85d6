"""Suspected SGLang leak (0.5.22, 0.5.23): a mamba slot is orphaned when the first turn of a
streaming session is evicted from the waiting queue by a higher-priority arrival
(``--enable-priority-scheduling`` with ``--max-queued-requests``).

    .venv/bin/python docs/real-bugs/sglang_first_turn_mamba_evict.py [VERSION]   (default 0.5.23)
    (VERSION: 0.5.22 or later, the releases kvwatch's checkpoint shim plays)

SGLang's own classes from the release's wheel, driven by hand in its scheduler's order:

1. a plain request with prompt P finishes: the tree holds P with a mamba state;
2. the first turn of a new session (P + more) is looked at once: the match copies the
   state into a fresh slot (``req.kv.mamba_pool_idx``); the session has no slot to lend yet;
3. the prefill adder rejects it; ``_get_new_batch_prefill_raw`` gives the copied slot back
   only ``if req.kv.holds_mamba and not getattr(req, "session", None)``: a session's turn keeps it;
4. ``_abort_on_queued_limit`` evicts the turn: ``_release_aborted_request`` and
   ``waiting_queue.pop``, with no ``release_kv_cache`` (``abort_request`` has one "For mamba
   radix cache"), so nothing frees the slot.

The probe then reports the slot as allocated and held by no one. A plain ``abort_request``
of the same queued turn frees it (shown for contrast). Exits 1 when the eviction leaks.
"""

from __future__ import annotations

import sys

from kvwatch.targets.sglang import shim_choice
from kvwatch.targets.sglang.cache_probe import CacheProbe
from kvwatch.targets.sglang.release_import import load
from kvwatch.targets.sglang.shim_parts import PoolConfig, ShimConfig

PROMPT = list(range(100, 140))
CONFIG = ShimConfig(pools=PoolConfig(kv_tokens=512, req_slots=8, mamba_slots=16), streaming=True)


def scenario(release, removal: str) -> list[str]:
    shim = shim_choice.make(release, CONFIG)
    probe = CacheProbe(shim)
    shim.submit("warm", PROMPT, 2)
    shim.run_until_idle()
    shim.open_session("sess")
    turn = shim.submit("sess-t0", [*PROMPT, 7, 8, 9], 4, session_id="sess")
    turn.init_next_round_input(shim.tree_cache)  # matched: a fresh mamba slot is copied
    assert turn.kv.holds_mamba and not turn.kv.holds_kv
    turn.kv.mamba_cow_src_index, turn.kv.mamba_needs_clear = None, False  # rejected
    if removal == "priority eviction":  # _abort_on_queued_limit
        shim._release_aborted_request(turn)
        shim.waiting_queue.remove(turn)
    else:
        shim.abort("sess-t0")
    shim.run_until_idle()
    shim.close_session("sess")
    shim.step()
    probe.flush()
    return [f.detail for f in probe.report().findings]


def main() -> int:
    version = sys.argv[1] if len(sys.argv) > 1 else "0.5.23"
    release = load(version)
    found = {}
    with release.active():
        for removal in ("abort", "priority eviction"):
            found[removal] = scenario(release, removal)
            shown = "; ".join(found[removal]) or "no finding"
            print(f"sglang {version}, first session turn removed by {removal}: {shown}")
    return 1 if found["priority eviction"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
