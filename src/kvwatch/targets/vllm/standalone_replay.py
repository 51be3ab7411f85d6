"""A kvwatch history replayed on vLLM's own v1 ``Scheduler`` with vLLM alone: no model, no GPU.

In kvwatch this file is a template: ``kvwatch histories --replay FILE --export OUT.py``
fills ``HISTORY`` with a saved vLLM history and writes it out. It imports nothing but
vLLM, torch and the standard library. Run it with the Python that has the vLLM
release it names::

    python OUT.py

The scheduler is built with no model over a tiny model's config, one
full-attention KV cache group, and stepped as the engine core steps it: each
step ``schedule()``, then the output a model runner would give (one token for
each request whose prompt is computed: a function of its id and length, never
EOS), then ``update_from_output``; with two steps in flight the output of the
step before is applied after this one is scheduled. Each turn's operations run
before their step: requests, streaming-input session chunks (one ``resumable``
request per chunk under the session's id, and a last non-resumable one when the
session closes), aborts (at once, or once the request is in a stage), prefix-cache
resets. A turn ends when no request has work left.

It exits 1 when the scheduler raises, or stalls: ``STALL`` steps in a row schedule
nothing while requests have work left, so no request can ever move again. Else it
prints what each request got and exits 0.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import sys
import tempfile
from collections import deque
from pathlib import Path

HISTORY: dict | None = None  # filled in when exported: {"vllm", "setup", "ops", "source"}
STALL = 64  # steps in a row that schedule nothing while requests have work left
MAX_STEPS = 5000  # per turn
MODEL = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
    "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 32, "num_hidden_layers": 2, "vocab_size": 2048,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    "bos_token_id": 0, "eos_token_id": 2, "torch_dtype": "float32",
}  # fmt: skip


def accepted(cls, **wanted) -> dict:
    params = inspect.signature(cls).parameters
    return {k: v for k, v in wanted.items() if k in params}


def build(setup: dict):
    """vLLM's Scheduler (AsyncScheduler with two steps in flight), one full-attention group."""
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    model_dir = Path(tempfile.mkdtemp(prefix="vllm-replay-"))
    (model_dir / "config.json").write_text(json.dumps(MODEL))
    block, context, in_flight = setup["block_size"], setup["context"], setup["in_flight"]
    options = setup.get("options") or {}
    base = accepted(
        SchedulerConfig, max_num_seqs=16, max_num_batched_tokens=setup["budget"],
        max_model_len=context, enable_chunked_prefill=True, async_scheduling=in_flight > 1,
        is_encoder_decoder=False, policy=setup["policy"],
    )  # fmt: skip
    scheduler = SchedulerConfig(**{**base, **options.get("scheduler", {})})
    model = ModelConfig(
        model=str(model_dir), dtype="float32", seed=0, skip_tokenizer_init=True,
        max_model_len=context,
    )  # fmt: skip
    cached = accepted(CacheConfig, block_size=block, enable_prefix_caching=True)
    cache = CacheConfig(**{**cached, **options.get("cache", {})})
    config = VllmConfig(scheduler_config=scheduler, model_config=model, cache_config=cache)
    config.cache_config.block_size = block
    config.cache_config.num_gpu_blocks = setup["num_blocks"]
    spec = FullAttentionSpec(block_size=block, num_kv_heads=1, head_size=8, dtype=torch.float32)
    kv = KVCacheConfig(
        num_blocks=setup["num_blocks"], kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layers.0.full"], spec)],
    )  # fmt: skip
    cls = Scheduler
    if in_flight > 1:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler as cls
    kwargs = {
        "vllm_config": config, "kv_cache_config": kv, "block_size": block, "log_stats": False,
        "structured_output_manager": StructuredOutputManager(config),
    }  # fmt: skip
    if "hash_block_size" in inspect.signature(cls).parameters:
        kwargs["hash_block_size"] = block
    return cls(**kwargs)


def hasher(block: int):
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    init_none_hash(sha256_cbor)
    return get_request_block_hasher(block, sha256_cbor)


def next_token(request_id: str, num_tokens: int) -> int:
    return 100 + (sum(map(ord, request_id)) * 31 + num_tokens) % 1500


class Replay:
    """The history's operations on the scheduler, stepped as the engine core steps it, and
    the clients' side: what each request got and how it ended."""

    def __init__(self, scheduler, setup: dict, rids: set[str]) -> None:
        self.s, self.setup, self.depth = scheduler, setup, setup["in_flight"]
        self.context, self.hash = setup["context"], hasher(setup["block_size"])
        self.rids = rids  # every request of the history
        self.queue: deque = deque()
        self.steps, self.quiet, self.sent = 0, 0, 0
        self.sessions: dict[str, list[str]] = {}  # session -> its turns, in order
        self.held: dict[str, int] = {}  # session -> its tokens once its chunks ran
        self.closed: set[str] = set()
        self.session_of: dict[str, str] = {}  # turn -> session
        self.sent_at: dict[str, int] = {}
        self.got: dict[str, list[int]] = {}  # request or turn -> tokens received
        self.ended: dict[str, str] = {}  # request or turn -> how it ended
        self.refused: dict[str, str] = {}
        self.given_up: set[str] = set()
        self.when: list = []  # (due, operation): run once due

    # -- the engine core's calls -----------------------------------------------------------
    def add(self, rid: str, tokens: list[int], max_new: int, priority=None, resumable=False):
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        self.sent += 1
        params = SamplingParams(max_tokens=max_new, ignore_eos=True, temperature=0.0)
        wanted = {
            "request_id": rid, "prompt_token_ids": list(tokens), "sampling_params": params,
            "pooling_params": None, "arrival_time": float(self.sent), "block_hasher": self.hash,
            "eos_token_id": None, "priority": priority or 0, "resumable": resumable,
        }  # fmt: skip
        self.s.add_request(Request(**accepted(Request, **wanted)))

    def output(self, out):
        from vllm.v1.outputs import ModelRunnerOutput

        ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            r = self.s.requests[rid]
            done = r.num_computed_tokens >= r.num_tokens
            sampled.append([next_token(rid, r.num_tokens)] if done else [])
        fields = {f.name for f in dataclasses.fields(ModelRunnerOutput)}
        wanted = {
            "req_ids": ids, "req_id_to_index": {r: i for i, r in enumerate(ids)},
            "sampled_token_ids": sampled, "logprobs": None, "prompt_logprobs_dict": {},
            "pooler_output": [],
        }  # fmt: skip
        return ModelRunnerOutput(**{k: v for k, v in wanted.items() if k in fields})

    def apply(self) -> None:
        outputs = self.s.update_from_output(*self.queue.popleft())
        for per_client in (outputs or {}).values():
            for o in per_client.outputs:
                sid = o.request_id if o.request_id in self.sessions else None
                who = self.current(sid) if sid else o.request_id
                if who is None:
                    continue
                self.got.setdefault(who, []).extend(o.new_token_ids)
                if o.finish_reason is not None:
                    self.ended[who] = str(o.finish_reason)

    def step(self) -> None:
        """``EngineCore.step_with_batch_queue``: schedule, a model runner's output, the
        oldest step's output applied once ``in_flight`` steps are out."""
        self.steps += 1
        if self.depth > 1 and self.queue and not self.s.has_requests():
            self.apply()
            return
        out = self.s.schedule()
        scheduled = out.total_num_scheduled_tokens or any(
            o.total_num_scheduled_tokens for o, _ in self.queue
        )
        self.quiet = 0 if scheduled else self.quiet + 1
        self.queue.append((out, self.output(out)))
        if len(self.queue) >= self.depth:
            self.apply()

    # -- the clients -------------------------------------------------------------------------
    def current(self, sid: str | None) -> str | None:
        return next((t for t in self.sessions.get(sid or "", ()) if t not in self.ended), None)

    def live(self) -> list[str]:
        """The requests with work left (a session by its current turn)."""
        out = []
        for rid, r in self.s.requests.items():
            if not any(w in r.status.name for w in ("STREAMING", "FINISHED")):
                out.append(self.current(rid) if rid in self.sessions else rid)
        return [r for r in out if r is not None]

    def idle(self) -> bool:
        return not self.live() and not self.queue

    def settled(self, rid: str) -> bool:
        return rid in self.ended or rid in self.refused

    def stage(self, rid: str) -> str | None:
        sid = self.session_of.get(rid)
        request = self.s.requests.get(sid or rid)
        if request is None or rid in self.ended:
            return None
        if sid and self.current(sid) != rid:
            return "queued"
        name = request.status.name
        if name == "PREEMPTED" or (name == "WAITING" and request.num_preemptions):
            return "retracted"
        if name == "RUNNING":
            done = request.num_computed_tokens >= request.num_prompt_tokens
            return "decoding" if done else "prefilling"
        return "queued" if name == "WAITING" else name.lower()

    def reached(self, rid: str, stage: str) -> bool:
        now = self.stage(rid)
        if stage == "waiting":
            return now == "queued" and self.steps > self.sent_at.get(rid, self.steps)
        return now == stage

    def refusal(self, op: dict) -> str:
        """Why vLLM's front end (or a client keeping its session inside the context)
        turns ``op`` down; "" where it takes it."""
        n, room = len(op["tokens"]), self.context
        if n == 0:
            return "The decoder prompt cannot be empty"
        if n >= room or n + op["max_new"] > room:
            return "longer than the model's maximum context length"
        sid = op["session"]
        if op["kind"] == "submit":
            return "already running" if op["rid"] in self.s.requests else ""
        if sid not in self.sessions or sid in self.closed:
            return "no open session"
        if any(self.ended.get(t) == "aborted" for t in self.sessions[sid]):
            return "the session's stream was aborted"
        if self.held[sid] + n + op["max_new"] > room:
            return "the session would pass the context"
        return ""

    def do(self, op: dict) -> None:
        """One operation now, or once the request it waits for (``after``) settled."""
        after = op.get("after")
        if after and after in self.rids and not self.settled(after):
            self.when.append((lambda: self.settled(after), {**op, "after": ""}))
            return
        kind, rid, sid = op["kind"], op["rid"], op["session"]
        if kind in ("submit", "turn"):
            self.sent_at[rid] = self.steps
            if why := self.refusal(op):
                self.refused[rid] = why
                return
            self.got[rid] = []
        if kind == "submit":
            self.add(rid, op["tokens"], op["max_new"], op.get("priority"))
        elif kind == "turn":
            self.sessions[sid].append(rid)
            self.session_of[rid] = sid
            self.held[sid] += len(op["tokens"]) + op["max_new"] - 1
            self.add(sid, op["tokens"], op["max_new"], op.get("priority"), resumable=True)
        elif kind == "open":
            self.sessions[sid], self.held[sid] = [], 0
            self.closed.discard(sid)
        elif kind == "close" and sid in self.sessions and sid not in self.closed:
            self.closed.add(sid)
            if sid in self.s.requests:
                self.add(sid, [0], 1)  # the input stream's end
        elif kind == "flush":
            self.s.reset_prefix_cache()
        elif kind == "abort" and rid in self.got and rid not in self.ended:
            stage = op.get("stage")
            if not stage or self.reached(rid, stage):
                self.abort(rid)
            else:
                self.when.append((lambda: self.reached(rid, stage), {**op, "stage": ""}))

    def abort(self, rid: str) -> None:
        from vllm.v1.request import RequestStatus

        sid = self.session_of.get(rid)
        if rid in self.ended or (sid or rid) not in self.s.requests:
            return
        for t in self.sessions[sid] if sid else [rid]:  # a cancelled stream ends its session
            self.ended.setdefault(t, "aborted")
        self.s.finish_requests([sid or rid], RequestStatus.FINISHED_ABORTED)

    def turn(self, ops: list[dict]) -> None:
        """As kvwatch runs a turn: before each step the waits that are due run, the turn
        ends once idle with no operation left for a later step, stalled clients give up,
        then the operations of this step run."""
        at: dict[int, list[dict]] = {}
        for op in ops:
            at.setdefault(op["at"], []).append(op)
        for k in range(MAX_STEPS):
            for due, op in list(self.when):
                if due():
                    self.when.remove((due, op))
                    self.do(op)
            if self.idle() and not any(i >= k for i in at):
                self.when.clear()
                return
            if self.quiet >= STALL:
                self.stalled()
            for op in at.pop(k, []):
                self.do(op)
            self.step()
        raise SystemExit(f"not idle after {MAX_STEPS} steps: {self.live()}")

    def stalled(self) -> None:
        """Nothing scheduled for ``STALL`` steps with work left. Waiting behind a session
        paused for its client's next chunk is how vLLM keeps sessions: the clients give
        up on the live requests. Anything else can never move again: exit 1."""
        paused = [
            rid for rid, r in self.s.requests.items()
            if "STREAMING" in r.status.name and r.num_computed_tokens > 0
        ]  # fmt: skip
        if not paused:
            pool = self.s.kv_cache_manager.block_pool
            print(
                f"STALL at step {self.steps}: {STALL} steps in a row scheduled nothing while "
                f"{', '.join(self.live())} had work left; {len(self.s.running)} running, "
                f"{pool.get_num_free_blocks()} of {len(pool.blocks) - 1} blocks free"
            )
            raise SystemExit(1)
        for rid in [r for r in self.live() if r not in self.given_up]:
            self.given_up.add(rid)
            self.abort(rid)

    def run(self, ops: list[dict]) -> None:
        for t in sorted({op["turn"] for op in ops}):
            self.turn([op for op in ops if op["turn"] == t])
        closing = [s for s in self.sessions if s not in self.closed]
        self.turn([{"kind": "close", "rid": "", "session": s, "at": 0} for s in closing])


def main() -> int:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    if HISTORY is None:
        sys.exit("this is the template: kvwatch histories --replay FILE --export OUT.py fills it")
    import vllm

    print(f"vLLM {vllm.__version__} (history saved for {HISTORY['vllm']}): {HISTORY['source']}")
    ops = HISTORY["ops"]
    rids = {op["rid"] for op in ops if op["kind"] in ("submit", "turn")}
    replay = Replay(build(HISTORY["setup"]), HISTORY["setup"], rids)
    replay.run(ops)
    for rid, why in replay.refused.items():
        print(f"{rid}: refused ({why})")
    for rid, tokens in replay.got.items():
        print(f"{rid}: {replay.ended.get(rid, 'live')}, {len(tokens)} tokens")
    print(f"idle after {replay.steps} steps; {len(replay.s.requests)} requests left")
    return 0


if __name__ == "__main__":
    sys.exit(main())
