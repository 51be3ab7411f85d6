"""``checks`` (``kvwatch.targets.vllm.checks``) on vLLM's own scheduler, clean and with each broken state planted.

The scheduler is the one ``--engine vllm-scheduler`` drives
(``scheduler_build.build`` and ``loop.Core``: no model, fake outputs), on the
release this Python has. Run it with vLLM's Python; it prints one JSON object,
a key per scenario, each with the rules the checks found (per step and at the
barrier, in order) and their first findings::

    python -P tests/targets/vllm/planted/checks.py

``clean``      streaming sessions with readers, waves sharing a prefix, priority
               preemption with two steps in flight: nothing found
``stale``      a session's next chunk replaces the token that completed its first
               block, and the hashes it had before are put back (what a rebuild that
               only appends leaves): the request, its block and a reader's hit disagree
``scratch``    at idle, block ids left in a group's ``new_block_ids`` (then more than
               the pool holds), and a finished request's id in ``num_cached_block``
``skipped``    one step of priority scheduling runs with a running request out of
               the scheduler's sight: it holds blocks, has work left, and was passed over
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from kvwatch.targets.vllm.loop import Core
from kvwatch.targets.vllm.scheduler_build import build
from kvwatch.targets.vllm.workloads import BLOCK, Priority, StreamingInput, Waves

MODEL = Path(tempfile.mkdtemp(prefix="kvwatch-vllm-checks-")) / "model"


def core_for(workload, concurrency: int) -> Core:
    settings = workload.settings(concurrency)
    in_flight = settings.pop("in_flight", 1)
    return Core(build(MODEL, in_flight=in_flight, **settings), in_flight)


class Seen:
    """The findings of every step (``Core.latched``) and barrier of one scenario."""

    def __init__(self, core: Core) -> None:
        self.core, self.found = core, []

    def barrier(self) -> None:
        for probe in self.core.probe()["probes"]:
            self.found += [f for f in probe["checks"] if f not in self.found]

    def report(self, **extra) -> dict:
        rules = list(dict.fromkeys(f["rule"] for f in self.found))
        first = {r: next(f for f in self.found if f["rule"] == r) for r in rules}
        return {"rules": rules, "first": first, **extra}


def clean() -> dict:
    out = {}
    for workload, c in ((StreamingInput(), 2), (Waves(), 4), (Priority(), 4)):
        seen = Seen(core_for(workload, c))
        for turn in range(3):
            workload.turn(seen.core, turn, c)
            seen.barrier()
        workload.close(seen.core, c)
        seen.barrier()
        out[workload.name] = seen.report()["rules"]
    return out


def stale() -> dict:
    """One session and a reader, by hand: P (15 tokens) samples X, which completes
    block 0; the next chunk Y drops X, and the plant gives back H(P + X)."""
    core = core_for(StreamingInput(), 1)
    seen = Seen(core)
    prompt = list(range(10, 10 + BLOCK - 1))
    core.add(core.request("A", prompt, max_tokens=1, resumable=True))
    core.run()
    session = core.scheduler.requests["A"]
    told, hashes = list(session.all_token_ids), list(session.block_hashes)
    core.add(core.request("A", [900] * BLOCK, max_tokens=1, resumable=True))
    session.block_hashes[: len(hashes)] = hashes  # the hashes the old tokens made
    seen.barrier()  # before the next step: the request's own chain
    core.add(core.request("B", [*told, 700, 701], max_tokens=1))
    core.run()
    seen.barrier()
    return seen.report(hashes=len(hashes), told=len(told))


def scratch() -> dict:
    core = core_for(Waves(), 2)
    Waves().turn(core, 0, 2)
    seen = Seen(core)
    manager = core.scheduler.kv_cache_manager.coordinator.single_type_managers[0]
    size = len(core.scheduler.kv_cache_manager.block_pool.blocks)
    manager.new_block_ids.extend([3, 4])
    seen.barrier()
    manager.new_block_ids.extend(range(size))
    seen.barrier()
    manager.new_block_ids.clear()
    manager.num_cached_block["wave-0-0"] = 1  # finished: the scheduler no longer knows it
    seen.barrier()
    return seen.report(pool=size)


def skipped() -> dict:
    core = core_for(Priority(), 4)
    scheduler, hidden = core.scheduler, []
    schedule = scheduler.schedule

    def out_of_sight():  # one step that never walks the request after the first running one
        if not hidden and len(scheduler.running) >= 3:
            hidden.append(scheduler.running.pop(1))
            try:
                return schedule()
            finally:
                scheduler.running.insert(1, hidden[0])
        return schedule()

    scheduler.schedule = out_of_sight
    seen = Seen(core)
    Priority().turn(core, 0, 4)
    seen.barrier()
    return seen.report(hidden=[r.request_id for r in hidden])


def main() -> None:
    scenarios = (clean, stale, scratch, skipped)
    print(json.dumps({scenario.__name__: scenario() for scenario in scenarios}))


if __name__ == "__main__":
    main()
