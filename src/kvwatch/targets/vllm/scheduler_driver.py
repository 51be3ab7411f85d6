"""One run of ``--engine vllm-scheduler``, in vLLM's own Python: its scheduler, stepped in process.

``vllm_sched_target.py`` starts this with the release's Python (and its
unpacked wheel in front, ``vllm_release.py``) for each run::

    python -P -m kvwatch.targets.vllm.scheduler_driver PLAN.json

It builds vLLM's own ``Scheduler`` (``AsyncScheduler`` where the workload
keeps two steps in flight) over a tiny model's config, with no model: each
step is ``schedule()``, then the output a model runner would give (one token
for each request whose prompt is done), then ``update_from_output``, as the
engine core does. The workload (``vllm_workloads.py``) sends requests in
turns. The checks run where the engine runs the model, right after each
``schedule()``: hashes against tokens, the hash ledger, liveness and scratch
over the pool (``vllm_checks.py``); a step whose findings show a rule not
seen before in the turn is kept as a probe (at most ``LATCH`` a turn). Once
a turn's requests are done, nothing is in flight and the barrier probe is
taken: the audit (``vllm_audit.py``), the checks, the registry sizes, in the
shape of the engine-core probe's ``GET /audit`` (``vllm_probe.answer``).
After the last turn the sessions close, the prefix cache is reset and the
drained probe is taken.

It writes the plan's ``record`` (JSON: ``vllm``, ``baseline``, ``turns``
with their probes, ``drained``, ``requests``, ``ended``, ``error``) and a
line per barrier to its ``progress`` file, as the Locust barrier action
does. vLLM is imported here only, never by the gate.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import sys
import time
import traceback
from collections import deque
from pathlib import Path

from kvwatch.targets.vllm.checks import HashLedger, check_hashes
from kvwatch.targets.vllm.core_probe import answer
from kvwatch.targets.vllm.liveness import LivenessTracker
from kvwatch.targets.vllm.scratch import check_scratch
from kvwatch.targets.vllm.workloads import WORKLOADS

LATCH = 8  # probes kept from the steps of one turn
MAX_STEPS = 20_000  # a turn that needs more never ends: the run broke
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


def accepted(cls, **wanted) -> dict:
    """The keyword arguments ``cls`` takes (they differ between releases)."""
    params = inspect.signature(cls).parameters
    return {k: v for k, v in wanted.items() if k in params}


def _configs(model_dir: Path, block_size: int, policy: str, in_flight: int):
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig

    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(MODEL))
    scheduler = SchedulerConfig(
        **accepted(
            SchedulerConfig,
            max_num_seqs=16,
            max_num_batched_tokens=256,
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
    cache = CacheConfig(**accepted(CacheConfig, block_size=block_size, enable_prefix_caching=True))
    config = VllmConfig(scheduler_config=scheduler, model_config=model, cache_config=cache)
    config.cache_config.block_size = block_size  # the CPU platform may have changed it
    return config


def build(model_dir: Path, *, block_size: int, num_blocks: int, policy="fcfs", in_flight=1):
    """vLLM's ``Scheduler`` (``AsyncScheduler`` with two steps in flight) on a pool of
    ``num_blocks`` blocks of one full-attention group."""
    import torch
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    config = _configs(model_dir, block_size, policy, in_flight)
    shape = {"block_size": block_size, "num_kv_heads": 1, "head_size": 8, "dtype": torch.float32}
    groups = [KVCacheGroupSpec(["layers.0.attn"], FullAttentionSpec(**shape))]
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    config.cache_config.num_gpu_blocks = num_blocks
    cls = Scheduler
    if in_flight > 1:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler as cls
    kwargs = {
        "vllm_config": config,
        "kv_cache_config": kv,
        "structured_output_manager": StructuredOutputManager(config),
        "block_size": block_size,
        "log_stats": False,
    }
    if "hash_block_size" in inspect.signature(cls).parameters:
        kwargs["hash_block_size"] = block_size
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

    def __init__(self, scheduler, in_flight: int = 1) -> None:
        self.scheduler, self.depth, self.queue = scheduler, in_flight, deque()
        self.hasher = _hasher(scheduler.block_size)
        self.liveness, self.ledger = LivenessTracker(), HashLedger()
        self.steps, self.sent = 0, 0
        self.latched: list[dict] = []
        self.seen: set[str] = set()

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
        }
        return Request(**accepted(Request, **wanted))

    def add(self, request) -> None:
        self.sent += 1
        self.scheduler.add_request(request)

    def step(self) -> None:
        """``schedule()``, the checks, a model runner's output; with two steps in
        flight the output of the step before is applied after this one is scheduled."""
        s = self.scheduler
        self.liveness.before(s)
        out = s.schedule()
        self.steps += 1
        found = check_hashes(s) + self.ledger.observe(s) + self.liveness.after(s, out)
        found += [f for f in check_scratch(s) if s.requests]  # idle: the barrier's to judge
        if {f.rule for f in found} - self.seen and len(self.latched) < LATCH:
            self.seen |= {f.rule for f in found}
            self.latched.append(answer(s, self.steps, found))
        self.queue.append((out, model_output(s, out)))
        if len(self.queue) >= self.depth:
            self._apply()

    def _apply(self) -> None:
        self.scheduler.update_from_output(*self.queue.popleft())

    def busy(self) -> bool:
        """Whether a request has work left (a session waiting for input has none)."""
        waiting = ("STREAMING", "FINISHED")
        return any(
            not any(w in str(r.status.name) for w in waiting)
            for r in self.scheduler.requests.values()
        )

    def run(self) -> None:
        """Step until nothing has work left and nothing is in flight."""
        for _ in range(MAX_STEPS):
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
        found = check_hashes(s) + self.ledger.observe(s) + check_scratch(s)
        probes = [*self.latched, answer(s, self.steps, found)]
        self.latched, self.seen = [], set()
        return {"probes": probes, "live": len(s.requests)}


def model_output(scheduler, out):
    """What a model runner returns for ``out``: a token for each request whose prompt is
    computed after this step, nothing for one still in a prefill chunk."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        request = scheduler.requests[rid]
        token = 100 + (sum(map(ord, rid)) * 31 + request.num_tokens) % 1500
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
        self.workload = WORKLOADS[plan["profile"]]()
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

    def __call__(self) -> dict:
        import vllm

        self.record["vllm"] = vllm.__version__
        try:
            settings = self.workload.settings(self.plan["concurrency"])
            in_flight = settings.pop("in_flight", 1)
            scheduler = build(Path(self.plan["model"]), in_flight=in_flight, **settings)
            core = Core(scheduler, in_flight)
            self.started = time.monotonic()  # the barriers' seconds count from the load
            self.turns(core)
            self.finish(core)
            self.progress(turn="end", ended=self.record["ended"])
        except Exception as exc:  # the run broke: the gate reports it (exit 3)
            tail = traceback.format_exception(exc)[-6:]
            self.record["error"] = f"{type(exc).__name__}: {exc} | {' '.join(tail)}"[:4000]
        return self.record


def main(argv: list[str]) -> int:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    plan = json.loads(Path(argv[0]).read_text())
    record = Run(plan)()
    out = Path(plan["record"])
    Path(f"{out}.part").write_text(json.dumps(record))
    Path(f"{out}.part").replace(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
