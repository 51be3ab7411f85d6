"""One run of ``--engine vllm-scheduler``, in vLLM's own Python: its scheduler, stepped in process.

``scheduler_target.py`` starts this with the release's Python (and its
unpacked wheel in front, ``release.py``) for each run::

    python -P -m kvwatch.targets.vllm.scheduler_driver PLAN.json

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
shape of the engine-core probe's ``GET /audit`` (``vllm_probe.answer``).
After the last turn the sessions close, the prefix cache is reset and the
drained probe is taken.

The KV cache layout is the workload's (``kv_layout.Layout``: groups, block
size, prefix-match unit, events), or the plan's ``layout`` where it names
one (the hunt, ``hunt.py``: the pool refitted to it, ``kv_layout.fit``), as
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
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import sys
import time
import traceback
import zlib
from collections import deque
from pathlib import Path

from kvwatch.targets.vllm.checks import HashLedger, check_hashes, hash_block_size
from kvwatch.targets.vllm.core_probe import answer
from kvwatch.targets.vllm.event_tap import EventTap
from kvwatch.targets.vllm.kv_groups import (
    Unsupported,
    accepted,
    block_sizes,
    configure,
    kv_cache_config,
)
from kvwatch.targets.vllm.kv_layout import Layout, fit, from_json
from kvwatch.targets.vllm.liveness import LivenessTracker, holds_blocks, reset_refused, stalled
from kvwatch.targets.vllm.sched_coverage import Coverage
from kvwatch.targets.vllm.sched_profiles import WORKLOADS
from kvwatch.targets.vllm.scratch import check_scratch

LATCH = 8  # probes kept from the steps of one turn
MAX_STEPS = 20_000  # a turn that needs more never ends: the run broke
STALL = 64  # steps in a row that schedule nothing, nothing in flight: nothing will move
# the tiny model's shape (targets/vllm/tinymodel.py); the scheduler reads its config only
MODEL = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "num_hidden_layers": 2,
    "vocab_size": 2048,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}


def _configs(model_dir: Path, layout: Layout, policy: str, in_flight: int, budget: int):
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig

    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(MODEL))
    scheduler = SchedulerConfig(
        **accepted(
            SchedulerConfig,
            max_num_seqs=16,
            max_num_batched_tokens=budget,
            max_model_len=1024,
            enable_chunked_prefill=True,
            async_scheduling=in_flight > 1,
            is_encoder_decoder=False,
            policy=policy,
        )
    )
    model = ModelConfig(
        model=str(model_dir), dtype="float32", seed=0, skip_tokenizer_init=True, max_model_len=1024
    )
    size = layout.block_size
    cache = CacheConfig(**accepted(CacheConfig, block_size=size, enable_prefix_caching=True))
    config = VllmConfig(scheduler_config=scheduler, model_config=model, cache_config=cache)
    config.cache_config.block_size = size  # the CPU platform may have changed it
    configure(config, layout)
    return config


def build(
    model_dir: Path,
    *,
    block_size: int,
    num_blocks: int,
    policy="fcfs",
    in_flight=1,
    layout: Layout | None = None,
    budget: int = 256,
):
    """vLLM's ``Scheduler`` (``AsyncScheduler`` with two steps in flight) on a pool of
    ``num_blocks`` blocks shared by the groups of ``layout`` (one full-attention group
    of ``block_size`` tokens when None), its block and hash sizes as vLLM resolves them
    (``kv_groups.py``), at most ``budget`` tokens a step."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    layout = layout or Layout(block_size=block_size)
    config = _configs(model_dir, layout, policy, in_flight, budget)
    kv = kv_cache_config(layout, num_blocks)
    config.cache_config.num_gpu_blocks = num_blocks
    scheduler_block, hash_block = block_sizes(kv, config, layout)
    cls = Scheduler
    if in_flight > 1:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler as cls
    kwargs = {
        "vllm_config": config,
        "kv_cache_config": kv,
        "structured_output_manager": StructuredOutputManager(config),
        "block_size": scheduler_block,
        "log_stats": False,
    }
    if "hash_block_size" in inspect.signature(cls).parameters:
        kwargs["hash_block_size"] = hash_block
    return cls(**kwargs)


def _hasher(block_size: int):
    """vLLM's request block hasher, sha256 over CBOR; ``init_none_hash`` once per
    process, as the engine core calls it (some releases seed it at random)."""
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    init_none_hash(sha256_cbor)
    return get_request_block_hasher(block_size, sha256_cbor)


class Core:
    """vLLM's scheduler stepped as its engine core steps it, with the checks after
    each ``schedule()`` and the probes the gate reads."""

    def __init__(self, scheduler, in_flight: int = 1, token_salt: int = 0) -> None:
        self.scheduler, self.depth, self.queue = scheduler, in_flight, deque()
        self.token_salt, self.sampled = token_salt, 0  # the model runner's tokens
        self.hasher = _hasher(hash_block_size(scheduler) or scheduler.block_size)
        self.liveness, self.ledger = LivenessTracker(), HashLedger()
        self.events, self.coverage = EventTap.install(scheduler), Coverage()
        self.steps, self.sent, self.aborted, self.idle = 0, 0, 0, 0
        self.latched: list[dict] = []
        self.seen: set[str] = set()
        self.applied: list = []  # the event findings of the outputs applied since the last look

    def request(self, request_id: str, tokens: list[int], *, max_tokens: int, **extra):
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
        wanted = {
            "request_id": request_id,
            "prompt_token_ids": list(tokens),
            "sampling_params": params,
            "pooling_params": None,
            "arrival_time": float(self.sent + 1),
            "block_hasher": self.hasher,
            "eos_token_id": None,
            "priority": extra.get("priority", 0),
            "resumable": extra.get("resumable", False),
            "cache_salt": extra.get("cache_salt"),
        }
        return Request(**accepted(Request, **wanted))

    def add(self, request) -> None:
        self.sent += 1
        self.scheduler.add_request(request)

    def abort(self, request_id: str) -> None:
        """The client went away: the engine core's ``abort_requests``."""
        from vllm.v1.request import RequestStatus

        if request_id in self.scheduler.requests:
            self.aborted += 1
            self.scheduler.finish_requests([request_id], RequestStatus.FINISHED_ABORTED)

    def step(self) -> None:
        """``schedule()``, the checks, a model runner's output; with two steps in
        flight the output of the step before is applied after this one is scheduled."""
        s = self.scheduler
        self.liveness.before(s)
        out = s.schedule()
        self.steps += 1
        self.coverage.step(s, out)
        found = check_hashes(s) + self.ledger.observe(s) + self.liveness.after(s, out)
        found += [f for f in check_scratch(s) if s.requests]  # idle: the barrier's to judge
        found += self.applied + self._stall(out)
        self.applied = []
        if {f.rule for f in found} - self.seen and len(self.latched) < LATCH:
            self.seen |= {f.rule for f in found}
            self.latched.append(answer(s, self.steps, found))
        output = model_output(s, out, self.token_salt)
        self.sampled += sum(map(len, output.sampled_token_ids))
        self.queue.append((out, output))
        if len(self.queue) >= self.depth:
            self._apply()

    def _apply(self) -> None:
        """The oldest step's output; the events it published checked against the pool."""
        self.scheduler.update_from_output(*self.queue.popleft())
        if self.events is not None:
            self.applied += self.events.check(self.scheduler)

    def busy(self) -> bool:
        """Whether a request has work left (a session waiting for input has none)."""
        return any(_has_work(r) for r in self.scheduler.requests.values())

    def reset(self) -> bool:
        """A weight update's cache reset under load (``reset_prefix_cache`` with
        ``reset_running_requests``, as ``pause_generation(clear_cache=True)`` calls it):
        whether it cleared the index; a refusal is a finding of the next probe."""
        try:
            done = bool(self.scheduler.reset_prefix_cache(reset_running_requests=True))
            why = "it returned False"
        except RuntimeError as exc:
            done, why = False, str(exc)
        if not done:
            self.applied.append(reset_refused(self.scheduler, why))
        return done

    def _stall(self, out) -> list:
        """``scheduler-stalled`` once ``STALL`` steps in a row scheduled nothing with
        nothing in flight while requests have work left, and no session paused for its
        client's next chunk holds blocks: the stuck requests wait on nothing a client can
        still release (a hold-and-wait). Waiting behind a paused session's blocks is how
        vLLM keeps sessions; it is counted (``stalls behind paused sessions``), not found."""
        scheduled = getattr(out, "total_num_scheduled_tokens", 0) or len(out.num_scheduled_tokens)
        self.idle = 0 if scheduled or self.queue else self.idle + 1
        if self.idle != STALL:
            return []
        requests = self.scheduler.requests
        if any(
            "STREAMING" in r.status.name and holds_blocks(self.scheduler, rid)
            for rid, r in requests.items()
        ):
            self.coverage.counts["stalls behind paused sessions"] += 1
            return []
        work = sorted(rid for rid, r in requests.items() if _has_work(r))
        return [stalled(self.scheduler, STALL, work)]

    def unstick(self) -> None:
        """After a stall: the clients of the requests that have work left give up
        (aborts; paused sessions stay), so the run goes on."""
        for rid in sorted(r for r, req in self.scheduler.requests.items() if _has_work(req)):
            self.abort(rid)
        self.idle = 0

    def run(self) -> None:
        """Step until nothing has work left and nothing is in flight (or it stalled)."""
        for _ in range(MAX_STEPS):
            if self.idle >= STALL:
                self.unstick()
            if not self.busy():
                break
            self.step()
        else:
            left = sorted(r for r in self.scheduler.requests)[:8]
            raise TimeoutError(f"requests still had work after {MAX_STEPS} steps: {left}")
        while self.queue:
            self._apply()

    def probe(self) -> dict:
        """The barrier probe: audit, checks (hashes, ledger, scratch) and the steps' latches."""
        s = self.scheduler
        found = check_hashes(s) + self.ledger.observe(s) + check_scratch(s) + self.applied
        if self.events is not None:
            self.events.drain(s)
            found += self.events.check(s)
        probes = [*self.latched, answer(s, self.steps, found)]
        self.latched, self.seen, self.applied = [], set(), []
        return {"probes": probes, "live": len(s.requests)}

    def covered(self) -> dict:
        """What the run exercised (``sched_coverage.py``), with the event totals."""
        c = self.coverage.as_dict(self.events.ledger.totals() if self.events else None)
        return {**c, "requests": self.sent, "aborts": self.aborted}


def _has_work(request) -> bool:
    return not any(w in str(request.status.name) for w in ("STREAMING", "FINISHED"))


def next_token(request_id: str, num_tokens: int, salt: int = 0) -> int:
    """The token the model runner samples: a function of the request's id and length
    only, in 100..1599 (never EOS). A non-zero ``salt`` (the plan's ``token_salt``)
    gives another function of the same inputs: a CRC of the salt, the id and the length."""
    if salt:
        return 100 + zlib.crc32(f"{salt}:{request_id}:{num_tokens}".encode()) % 1500
    return 100 + (sum(map(ord, request_id)) * 31 + num_tokens) % 1500


def model_output(scheduler, out, token_salt: int = 0):
    """What a model runner returns for ``out``: a token for each request whose prompt is
    computed after this step (``next_token``), nothing for one still in a prefill chunk."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        request = scheduler.requests[rid]
        token = next_token(rid, request.num_tokens, token_salt)
        sampled.append([token] if request.num_computed_tokens >= request.num_tokens else [])
    fields = {f.name for f in dataclasses.fields(ModelRunnerOutput)}
    wanted = {
        "req_ids": ids,
        "req_id_to_index": {rid: i for i, rid in enumerate(ids)},
        "sampled_token_ids": sampled,
        "logprobs": None,
        "prompt_logprobs_dict": {},
        "pooler_output": [],
    }
    return ModelRunnerOutput(**{k: v for k, v in wanted.items() if k in fields})


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
        flushed = bool(core.scheduler.reset_prefix_cache())
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
