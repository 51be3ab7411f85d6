"""One run of ``--engine vllm-scheduler``, in vLLM's own Python: its scheduler, stepped in process.

``scheduler_target.py`` starts this with the release's Python (and its
unpacked wheel in front, ``release.py``) for each run::

    python -P -m kvwatch.targets.vllm.run_driver PLAN.json

It builds vLLM's own ``Scheduler`` (``AsyncScheduler`` where the workload
keeps two steps in flight) over a tiny model's config, with no model: each
step is ``schedule()``, then the output a model runner would give (one token
for each request whose prompt is done), then ``update_from_output``, as the
engine core does. The workload (``workloads.py``) sends requests in
turns. The checks run where the engine runs the model, right after each
``schedule()``: hashes against tokens, the hash ledger, liveness and scratch
over the pool (``checks.py``); a step whose findings show a rule not
seen before in the turn is kept as a probe (at most ``LATCH`` a turn). Once
a turn's requests are done, nothing is in flight and the barrier probe is
taken: the audit (``manager_audit.py``), the checks, the registry sizes, in the
shape of the engine-core probe's ``GET /audit`` (``core_probe.answer``).
After the last turn the sessions close, the prefix cache is reset and the
drained probe is taken.

The KV cache layout is the workload's (``kv_layout.Layout``: groups, block
size, prefix-match unit, events), or the plan's ``layout`` where it names
one (the hunt, ``hunts/vllm.py``: the pool refitted to it, ``kv_layout.fit``), as
are ``sched`` (``policy``, ``in_flight``, ``budget``: tokens a step), ``seed``
and ``steps``. The tokens the model runner samples come from ``next_token``;
a plan's ``token_salt`` (absent: 0) makes them another function of the same
inputs, so a test can swap what kvwatch plays of the model and see that
vLLM's own code still decides the verdict. With
events on, each ``KVEventBatch`` is checked against the pool right after the
``update_from_output`` that published it (``event_tap.py``).

It writes the plan's ``record`` (JSON: ``vllm``, ``layout``, ``sizes``,
``baseline``, ``turns`` with their probes, ``drained``, ``requests``,
``coverage``, ``tokens`` (the token salt and how many tokens were sampled),
``ended``, ``error``; ``unsupported`` when the release cannot
build the layout) and a line per barrier to its ``progress`` file, as the
Locust barrier action does. vLLM is imported here only, never by the gate.

This module is the entry point: it reads the plans, runs each one's turns and
writes its record. The scheduler is built by ``scheduler_build.py``, stepped
and probed by ``loop.py`` (``Core``), and fed a model runner's output
by ``model_runner.py``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

from kvwatch.targets.vllm.kv_groups import Unsupported
from kvwatch.targets.vllm.kv_layout import Layout, fit, from_json
from kvwatch.targets.vllm.loop import Core
from kvwatch.targets.vllm.sched_profiles import WORKLOADS
from kvwatch.targets.vllm.scheduler_build import build
from kvwatch.targets.vllm.scheduler_reads import hash_block_size


class Run:
    """One plan: the workload's turns on a fresh scheduler, probed, written as JSON."""

    def __init__(self, plan: dict) -> None:
        self.plan, self.started = plan, time.monotonic()
        self.workload = WORKLOADS[plan["profile"]](
            seed=plan.get("seed", 0), steps=plan.get("steps")
        )
        self.record: dict = {"turns": [], "error": None}

    def progress(self, **fields) -> None:
        fields["elapsed"] = round(time.monotonic() - self.started, 1)
        with open(self.plan["progress"], "a") as f:
            f.write(json.dumps(fields) + "\n")

    def counts(self, core: Core, left: int = 0) -> dict:
        """Every request sent (each session chunk one) ended or waits for input, but
        ``left``: still live once the run is over."""
        return {"status": {"2xx": core.sent - left}, "failed": left, "broken_turns": 0}

    def turns(self, core: Core) -> None:
        c = self.plan["concurrency"]
        self.record["baseline"] = core.probe()["probes"][-1]
        for turn in range(self.plan["turns"]):
            self.workload.turn(core, turn, c)
            taken = core.probe()
            self.record["turns"].append(
                {
                    "turn": turn,
                    "probes": taken["probes"],
                    "conversations": c,
                    "context_tokens": self.workload.context_tokens(core),
                    "at": time.time(),
                    "requests": self.counts(core),
                }
            )
            flagged = sum(bool(p["audit"]["findings"] or p["checks"]) for p in taken["probes"])
            self.progress(turn=turn, conversations=c, probes=len(taken["probes"]), flagged=flagged)

    def finish(self, core: Core) -> None:
        self.workload.close(core, self.plan["concurrency"])
        flushed = core.flush()
        self.record["drained"] = core.probe()["probes"][-1]
        left = len(core.scheduler.requests)
        closed = "sessions closed, " if self.workload.sessions else ""
        flush = "flushed" if flushed else f"not flushed: {left} requests still live"
        self.record["ended"] = f"{closed}drained and {flush}"
        self.record["requests"] = self.counts(core, left)
        self.record["coverage"] = core.covered()
        self.record["tokens"] = {"salt": core.token_salt, "sampled": core.sampled}

    def scheduler(self):
        """vLLM's scheduler for the workload's settings, in the plan's layout if it names one."""
        settings = self.workload.settings(self.plan["concurrency"])
        if self.plan.get("layout"):
            settings = fit(settings, from_json(self.plan["layout"]), self.plan["concurrency"])
        settings.update(self.plan.get("sched") or {})  # policy, in_flight, budget: the hunt's
        in_flight = settings.pop("in_flight", 1)
        layout = settings.get("layout") or Layout(block_size=settings["block_size"])
        self.record["layout"] = layout.label
        scheduler = build(Path(self.plan["model"]), in_flight=in_flight, **settings)
        self.record["sizes"] = {
            "block": scheduler.block_size,
            "hash": hash_block_size(scheduler) or scheduler.block_size,
            "coordinator": type(scheduler.kv_cache_manager.coordinator).__name__,
            "pool": len(scheduler.kv_cache_manager.block_pool.blocks),
        }
        return scheduler, in_flight

    def __call__(self) -> dict:
        import vllm

        self.record["vllm"] = vllm.__version__
        try:
            scheduler, in_flight = self.scheduler()
            core = Core(scheduler, in_flight, self.plan.get("token_salt", 0))
            self.started = time.monotonic()  # the barriers' seconds count from the load
            self.turns(core)
            self.finish(core)
            self.progress(turn="end", ended=self.record["ended"])
        except Unsupported as exc:  # the release cannot build the layout: not a finding
            self.record["error"] = self.record["unsupported"] = str(exc)
        except Exception as exc:  # the run broke: the gate reports it (exit 3)
            tail = traceback.format_exception(exc)[-6:]
            self.record["error"] = f"{type(exc).__name__}: {exc} | {' '.join(tail)}"[:4000]
        return self.record


def main(argv: list[str]) -> int:
    """Each plan in turn, on a fresh scheduler (the hunt passes several: vLLM is
    imported once); each record written whole once its run is over."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # a GPU build's scheduler, on CPU
    for path in argv:
        plan = json.loads(Path(path).read_text())
        started = time.monotonic()
        record = Run(plan)()
        record["wall_s"] = round(time.monotonic() - started, 2)
        out = Path(plan["record"])
        Path(f"{out}.part").write_text(json.dumps(record))
        Path(f"{out}.part").replace(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
