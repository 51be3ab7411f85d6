"""The layout profiles and the event check on vLLM's own scheduler, clean and with faults planted.

The scheduler is the one ``--engine vllm-scheduler`` drives (``build`` and
``Core`` of ``loop.py``), on the release this Python has, in the
layouts of ``layout_workloads.py``. Run it with vLLM's Python; it prints one
JSON object, a key per scenario, with the rules found (every step and every
barrier, in order) and the first finding of each::

    python -P tests/targets/vllm/planted/layouts.py

``clean``             each layout profile, three turns at c = 2 (``hybrid-mamba``
                      at 4, where it preempts): no rule, and what each exercised
``removal-dropped``   the pool drops the events of one eviction
``removal-doubled``   the pool sends the events of one eviction twice
``store-dropped``     one ``BlockStored`` is taken out of the pool's queue
``store-invented``    a ``BlockStored`` for a hash the pool never held is queued
``partial-moved``     a live request's partial-block entry claims 16 tokens fewer
                      than it covers, and another's a boundary off the hash unit
``extra-key-foreign`` a block held by a live request gets a second key filed beside
                      its own (in the map too): a hash of other tokens
``sessions-stall``    nothing planted: two streaming sessions that hold the whole
                      pool while waiting for input each send a chunk that needs
                      more blocks (vLLM's open PR #49439 is about this stall)
``sessions-reset``    nothing planted: a forced prefix-cache reset while a session
                      waits for input (``docs/real-bugs/vllm_reset_with_waiting_session.py``)

Each plant is in vLLM's own objects (its ``BlockPool`` methods or state), so
what catches it is the same code that runs on a gate.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict
from pathlib import Path

from kvwatch.targets.vllm.hash_checks import check_hashes
from kvwatch.targets.vllm.kv_layout import Layout
from kvwatch.targets.vllm.layout_workloads import LAYOUT_WORKLOADS, KvEvents, MidBlockPrefix
from kvwatch.targets.vllm.loop import Core
from kvwatch.targets.vllm.scheduler_build import build
from kvwatch.targets.vllm.scheduler_reads import group_managers, table
from kvwatch.targets.vllm.token_hashes import covered

MODEL = Path(tempfile.mkdtemp(prefix="kvwatch-vllm-layouts-")) / "model"


def core_for(workload, concurrency: int) -> Core:
    settings = workload.settings(concurrency)
    in_flight = settings.pop("in_flight", 1)
    return Core(build(MODEL, in_flight=in_flight, **settings), in_flight)


def rules_of(core: Core, workload, concurrency: int, turns: int) -> list[dict]:
    """Every finding of ``turns`` turns and the barrier after each, in order, once each."""
    found: list[dict] = []
    for turn in range(turns):
        workload.turn(core, turn, concurrency)
        for probe in core.probe()["probes"]:
            found += [f for f in probe["checks"] if f not in found]
    return found


def report(found: list[dict], **extra) -> dict:
    rules = list(dict.fromkeys(f["rule"] for f in found))
    first = {r: next(f for f in found if f["rule"] == r) for r in rules}
    return {"rules": rules, "first": first, **extra}


def clean() -> dict:
    out = {}
    for name, cls in LAYOUT_WORKLOADS.items():
        c = 4 if name == "hybrid-mamba" else 2
        workload = cls()
        core = core_for(workload, c)
        found = rules_of(core, workload, c, 3)
        core.scheduler.reset_prefix_cache()
        found += [f for p in core.probe()["probes"] for f in p["checks"]]
        out[name] = report(found, coverage=core.covered())
    return out


def _patched(core: Core, name: str, wrap) -> None:
    """``BlockPool.<name>`` of ``core``'s pool replaced by ``wrap(original)``."""
    pool = core.scheduler.kv_cache_manager.block_pool
    setattr(pool, name, wrap(getattr(pool, name)))


def _once(fault):
    """A wrapper that applies ``fault`` to the first call with something to act on."""
    done = []

    def wrap(original):
        def call(*args, **kwargs):
            if not done and args and args[0]:
                done.append(True)
                return fault(original, *args, **kwargs)
            return original(*args, **kwargs)

        return call

    return wrap


def removal(kind: str) -> dict:
    """One eviction's ``BlockRemoved`` events dropped (``dropped``) or sent twice."""

    def dropped(original, hashes):
        return None

    def doubled(original, hashes):
        original(hashes)
        original(hashes)

    core = core_for(KvEvents(), 2)
    _patched(core, "_emit_block_removed_events", _once(dropped if kind == "dropped" else doubled))
    return report(rules_of(core, KvEvents(), 2, 3))


def store(kind: str) -> dict:
    """One ``BlockStored`` taken out of the queue, or one for a hash nobody holds put in."""
    core = core_for(KvEvents(), 2)
    pool = core.scheduler.kv_cache_manager.block_pool
    original, done = pool.cache_full_blocks, []

    def cache_full_blocks(*args, **kwargs):
        before = len(pool.kv_event_queue)
        original(*args, **kwargs)
        if not done and len(pool.kv_event_queue) > before:
            done.append(True)
            event = pool.kv_event_queue.pop()
            if kind == "invented":
                pool.kv_event_queue.append(event)
                ghost = type(event)(**{**_fields(event), "block_hashes": [b"\x01" * 32]})
                pool.kv_event_queue.append(ghost)

    pool.cache_full_blocks = cache_full_blocks
    return report(rules_of(core, KvEvents(), 2, 2))


def _fields(event) -> dict:
    return {name: getattr(event, name) for name in event.__struct_fields__}


def _partial_holders(core: Core) -> list:
    """(request id, block) of live requests' blocks whose hash ends inside the block."""
    out = []
    for _, manager in group_managers(core.scheduler):
        for rid in sorted(core.scheduler.requests):
            for i, block in enumerate(table(manager, rid)):
                if block.block_hash is not None and covered(block, i, manager.block_size) % (
                    manager.block_size
                ):
                    out.append((rid, block))
    return out


def partial(kind: str) -> dict:
    """Step ``mid-block-prefix`` until live requests hold partial-block entries, plant, check."""
    workload = MidBlockPrefix()
    core = core_for(workload, 2)
    for i in range(2):
        core.add(core.request(f"p-{i}", workload.SYSTEM + [500 + i] * (3 + i), max_tokens=30))
    for _ in range(4):
        core.step()
    held = _partial_holders(core)
    if not held:
        return {"rules": [], "first": {}, "planted": 0}
    rid, block = held[0]
    if kind == "moved":
        block._block_hash_num_tokens -= 16
        if len(held) > 1:
            held[1][1]._block_hash_num_tokens -= 1
    else:
        pool = core.scheduler.kv_cache_manager.block_pool
        foreign = b"\x02" * 32 + block.block_hash[-4:]
        pool.cached_block_hashes_by_block.setdefault(block.block_id, set()).add(foreign)
        pool.cached_block_hash_to_block.insert(foreign, block)
    found = [json.loads(json.dumps(asdict(f))) for f in check_hashes(core.scheduler)]
    return report(found, planted=len(held), request=rid, block=block.block_id)


def sessions_stall() -> dict:
    """Not planted: vLLM's own hold-and-wait. Two streaming sessions hold the whole pool
    (5 blocks each of 10) while they wait for input; both send a chunk that needs more
    blocks; nothing runs, so nothing can be preempted, and no step schedules anything."""
    core = Core(build(MODEL, block_size=16, num_blocks=11, layout=Layout(events=True)))
    for sid, base in (("A", 100), ("B", 300)):
        core.add(core.request(sid, list(range(base, base + 79)), max_tokens=1, resumable=True))
    core.run()
    for sid, base in (("A", 500), ("B", 700)):
        core.add(core.request(sid, list(range(base, base + 32)), max_tokens=1, resumable=True))
    core.run()  # stalls, then the clients give up (``Core.unstick``)
    found = [f for p in core.probe()["probes"] for f in p["checks"]]
    return report(found, aborted=core.aborted)


def sessions_reset() -> dict:
    """Not planted: a forced reset (a weight update's) while a streaming session waits
    for its next chunk and another request runs."""
    core = Core(build(MODEL, block_size=16, num_blocks=32, layout=Layout(events=True)))
    core.add(core.request("S", list(range(100, 140)), max_tokens=1, resumable=True))
    core.add(core.request("R", list(range(300, 340)), max_tokens=50))
    for _ in range(3):
        core.step()
    done = core.reset()
    status = {rid: r.status.name for rid, r in sorted(core.scheduler.requests.items())}
    found = [f for p in core.probe()["probes"] for f in p["checks"]]
    return report(found, reset=done, status=status)


def main() -> None:
    scenarios = {
        "clean": clean,
        "removal-dropped": lambda: removal("dropped"),
        "removal-doubled": lambda: removal("doubled"),
        "store-dropped": lambda: store("dropped"),
        "store-invented": lambda: store("invented"),
        "partial-moved": lambda: partial("moved"),
        "extra-key-foreign": lambda: partial("foreign"),
        "sessions-stall": sessions_stall,
        "sessions-reset": sessions_reset,
    }
    print(json.dumps({name: scenario() for name, scenario in scenarios.items()}))


if __name__ == "__main__":
    main()
