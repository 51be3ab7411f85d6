"""The reference engine piece by piece: model math, paged execution, lifecycle, API."""

from __future__ import annotations

import random

import pytest
import torch
from conversations import small_cache
from modelref import dense_forward, dense_greedy

from kvwatch.engine import Engine, EngineConfig, SamplingParams, SchedulerConfig, SpecConfig
from kvwatch.engine.config import LINEAR_STATE, SWA_WINDOW, ModelConfig
from kvwatch.engine.errors import EngineError, ErrorKind
from kvwatch.engine.events import (
    BatchComputed,
    PrefillChunk,
    RequestAborted,
    RequestAdded,
    RequestFailed,
    RequestFinished,
    RequestScheduled,
    TokensGenerated,
)
from kvwatch.engine.model.layers import attend, linear_scan
from kvwatch.engine.model.tokenizer import ASSISTANT, BOS, END, USER, ByteTokenizer, ChatTemplate
from kvwatch.engine.request import Status
from kvwatch.engine.views import ComputedBatch

GREEDY = SamplingParams(max_tokens=8)


def make_engine(chunk: int = 16, spec: bool = False, **cache) -> Engine:
    sched = SchedulerConfig(max_running=8, chunk_size=chunk, spec=SpecConfig() if spec else None)
    return Engine(EngineConfig(cache=small_cache(**cache), scheduler=sched))


def words(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(32, 127) for _ in range(n)]


def drain_and_flush(engine: Engine) -> None:
    while engine.has_unfinished():
        engine.step()
    for rid in engine.request_ids():
        engine.take(rid)
    engine.flush_cache()
    report = engine.probe()
    assert report.clean, report.findings
    assert all(g.free == g.capacity for g in report.groups.values()), report.groups


# -- tokenizer and template -------------------------------------------------------------
def test_byte_tokenizer_round_trips_unicode_and_rejects_lone_surrogates():
    tok = ByteTokenizer()
    assert tok.decode(tok.encode("héllo, wörld ✓")) == "héllo, wörld ✓"
    with pytest.raises(ValueError, match="not valid Unicode"):
        tok.encode("bad \ud800 surrogate")


def test_chat_template_marks_turns():
    ids = ChatTemplate().render([{"role": "user", "content": "hi"}])
    assert ids == [BOS, USER, ord("h"), ord("i"), END, ASSISTANT]
    with pytest.raises(ValueError, match="unknown role"):
        ChatTemplate().render([{"role": "robot", "content": "x"}])


# -- model math ----------------------------------------------------------------------------
def test_attention_matches_a_per_query_loop():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(5, 2, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(5)
    got = attend(q[None], k[None], v[None], pos[None], pos[None], window=3)[0]
    for p in range(5):
        keys = [t for t in range(5) if p - 3 < t <= p]
        scores = torch.einsum("hd,thd->ht", q[p], k[keys]) / 2
        assert torch.allclose(got[p], torch.einsum("ht,thd->hd", scores.softmax(-1), v[keys]))


def test_linear_scan_matches_the_closed_form():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(6, 2, 3, generator=gen, dtype=torch.float64) for _ in range(3))
    decay = torch.tensor([0.5, 0.9], dtype=torch.float64)
    zero = torch.zeros(1, 2, 3, 3, dtype=torch.float64)
    out, kept = linear_scan(q[None], k[None], v[None], decay, zero, [{4, 6}])
    out, kept = out[0], kept[0]
    fk, fq = torch.nn.functional.elu(k) + 1, torch.nn.functional.elu(q) + 1
    for t in (4, 6):
        state = sum(
            decay[:, None, None] ** (t - 1 - i) * fk[i, :, :, None] * v[i, :, None, :]
            for i in range(t)
        )
        assert torch.allclose(kept[t], state)
        assert torch.allclose(out[t - 1], torch.einsum("hd,hde->he", fq[t - 1], state))


def test_padded_batch_attention_equals_each_sequence_alone():
    """Padding keys get weight 0: a sequence's output does not depend on its batch."""
    gen = torch.Generator().manual_seed(2)
    lengths = (7, 3, 5)
    keys = [torch.randn(t, 2, 4, generator=gen, dtype=torch.float64) for t in lengths]
    values = [torch.randn(t, 2, 4, generator=gen, dtype=torch.float64) for t in lengths]
    q = torch.randn(3, 1, 2, 4, generator=gen, dtype=torch.float64)
    width = max(lengths)
    k_pad = torch.stack([torch.cat([k, k[:1].expand(width - len(k), -1, -1)]) for k in keys])
    v_pad = torch.stack([torch.cat([v, v[:1].expand(width - len(v), -1, -1)]) for v in values])
    k_pos = torch.arange(width).expand(3, -1)
    valid = k_pos < torch.tensor(lengths)[:, None]
    q_pos = torch.tensor(lengths)[:, None] - 1
    for window in (None, 2):
        got = attend(q, k_pad, v_pad, q_pos, k_pos, window, valid)
        for b, t in enumerate(lengths):
            alone = attend(
                q[b : b + 1],
                keys[b][None],
                values[b][None],
                q_pos[b : b + 1],
                torch.arange(t)[None],
                window,
            )
            assert torch.allclose(got[b], alone[0], rtol=0, atol=1e-12)


def test_model_config_rejects_a_pattern_without_every_layer_kind():
    with pytest.raises(ValueError, match="needs at least one L layer"):
        ModelConfig(layers="FSF")


# -- paged execution -----------------------------------------------------------------------
@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_paged_execution_matches_the_dense_forward(chunk):
    engine = make_engine(chunk=chunk)
    prompt = words(90)
    done = engine.generate([prompt], SamplingParams(max_tokens=6, logprobs=True))[0]
    assert done.token_ids == dense_greedy(engine.model, prompt, 6)
    dense = dense_forward(engine.model, prompt + done.token_ids[:-1])
    want = dense.logits[len(prompt) - 1 :].log_softmax(-1)
    picked = want[torch.arange(6), torch.tensor(done.token_ids)]
    assert torch.allclose(torch.tensor(done.logprobs, dtype=picked.dtype), picked, atol=1e-9)


def test_snapshots_restore_exactly():
    """A turn's terminal snapshot holds what a dense run computes at that depth,
    and a request resuming from it continues exactly as a dense run does."""
    engine = make_engine(chunk=7)
    prompt = words(70)
    first = engine.generate([prompt], GREEDY)[0]
    history = prompt + first.token_ids
    node = max(engine._cache.view.tree.snapshot_nodes, key=lambda n: n.depth)
    dense = dense_forward(engine.model, history[: node.depth])
    snap = node.snapshot.pages
    state = engine._cache.pools[LINEAR_STATE].page_data(snap[LINEAR_STATE])[0, 0]
    assert torch.allclose(state, dense.states, rtol=1e-12, atol=1e-12)
    window = engine._cache.pools[SWA_WINDOW].read_tokens(
        snap[SWA_WINDOW], 0, engine.config.cache.window
    )
    assert torch.allclose(window, dense.window_kv, rtol=1e-12, atol=1e-12)
    follow = history + words(12, seed=1)
    second = engine.generate([follow], GREEDY)[0]
    assert second.cached_tokens == node.depth > 0
    assert second.token_ids == dense_greedy(engine.model, follow, 8)


def test_routed_experts_of_cached_tokens_equal_recomputed_ones():
    engine = make_engine()
    prompt = words(80)
    params = SamplingParams(max_tokens=4, return_routed_experts=True)
    first = engine.generate([prompt], params)[0]
    cached = engine.generate([prompt + first.token_ids + [33]], params)[0]
    assert cached.cached_tokens > 0
    cfg = engine.config.model
    assert first.routed_experts.shape == (len(prompt) + 3, len(cfg.layers), cfg.top_k)
    fresh = make_engine().generate([prompt + first.token_ids + [33]], params)[0]
    assert torch.equal(cached.routed_experts, fresh.routed_experts)
    assert torch.equal(cached.routed_experts[: len(prompt) + 3], first.routed_experts)


# -- lifecycle --------------------------------------------------------------------------------
def stage_events(engine: Engine) -> list[RequestAborted]:
    seen: list[RequestAborted] = []
    engine.events.subscribe(RequestAborted, seen.append)
    return seen


def test_abort_at_every_stage_frees_exactly_what_the_request_held():
    engine = make_engine(chunk=8, spec=True)
    seen = stage_events(engine)
    repetitive = [40, 41, 42, 43] * 10  # gives the n-gram proposer drafts
    queued = engine.add_request(words(50, 1), GREEDY)
    engine.abort(queued)
    prefill = engine.add_request(words(60, 2), GREEDY)
    engine.step()
    engine.abort(prefill)
    decode = engine.add_request(words(10, 3), SamplingParams(max_tokens=30))
    while engine.request_info(decode).output_tokens < 2:
        engine.step()
    engine.abort(decode)
    verify = engine.add_request(repetitive, SamplingParams(max_tokens=40))

    def abort_mid_verify(batch: ComputedBatch) -> None:
        if verify in batch.verifying:
            engine.abort(verify)

    engine.on_batch_computed(abort_mid_verify)
    while not engine.request_info(verify).done:
        engine.step()
    assert [e.stage for e in seen] == ["queued", "prefill", "decode", "verify"]
    assert engine.probe().clean
    drain_and_flush(engine)


def test_batch_hooks_are_control_and_batch_events_are_telemetry():
    """A hook runs after the forward and before the results are applied, and what it
    raises leaves the step; a ``BatchComputed`` handler that raises changes nothing."""
    engine = make_engine()
    order: list[str] = []
    engine.events.subscribe(BatchComputed, lambda e: order.append(f"event {e.step}"))
    engine.events.subscribe(TokensGenerated, lambda e: order.append(f"tokens {e.step}"))

    def broken_listener(event: BatchComputed) -> None:
        raise RuntimeError("listener bug")

    engine.events.subscribe(BatchComputed, broken_listener)
    batches: list[ComputedBatch] = []
    remove = engine.on_batch_computed(lambda b: (batches.append(b), order.append("hook")))
    rid = engine.add_request(words(10), GREEDY)
    engine.step()
    assert order == ["event 0", "hook", "tokens 0"]
    assert batches == [ComputedBatch(0, (rid,), (0,))] and batches[0].verifying == ()
    assert engine.events.failures == {"BatchComputed": 1}
    remove()
    engine.step()
    assert len(batches) == 1 and order[-1] == "tokens 1"  # a removed hook is not called

    def broken_hook(batch: ComputedBatch) -> None:
        raise RuntimeError("control failed")

    engine.on_batch_computed(broken_hook)
    with pytest.raises(RuntimeError, match="control failed"):
        engine.step()
    assert not engine.in_step


def test_abort_of_retracted_and_paused_requests():
    engine = make_engine()
    seen = stage_events(engine)
    a, b, c = (engine.add_request(words(40, i), SamplingParams(max_tokens=20)) for i in range(3))
    engine.step()
    engine.retract(b)
    engine.pause(c)
    assert engine.request_info(b).status is Status.RETRACTED
    assert engine.request_info(c).status is Status.PAUSED
    engine.abort(b)
    engine.abort(c)
    assert [e.stage for e in seen] == ["retracted", "paused"]
    assert engine.probe().clean
    drain_and_flush(engine)
    assert engine.request_info(a) is None


def test_an_abort_on_an_idle_engine_is_handed_over_by_the_next_step():
    """The last request aborted between steps: its output waits for a step, so the
    engine has work until a step returned it (a loop that steps only while there
    is work would otherwise keep it for good)."""
    engine = make_engine()
    rid = engine.add_request(words(40), SamplingParams(max_tokens=20))
    engine.step()
    engine.abort(rid)
    assert engine.has_unfinished()
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    assert [(o.request_id, o.finish_reason) for o in outputs] == [(rid, "abort")]
    assert engine._scheduler.outputs == []


def test_pause_and_resume_give_the_same_output():
    prompt = words(60, 5)
    want = make_engine().generate([prompt], SamplingParams(max_tokens=12))[0].token_ids
    engine = make_engine(chunk=8)
    rid = engine.add_request(prompt, SamplingParams(max_tokens=12))
    for _ in range(10):
        engine.step()
    engine.pause(rid)
    engine.step()
    assert engine.request_info(rid).status is Status.PAUSED and engine.probe().clean
    engine.resume(rid)
    while engine.has_unfinished():
        engine.step()
    assert engine.take(rid).token_ids == want


def test_a_request_larger_than_the_pool_fails_alone_and_the_loop_goes_on():
    engine = make_engine(full=8)  # 128 tokens of full.kv in all
    failed: list[RequestFailed] = []
    engine.events.subscribe(RequestFailed, failed.append)
    big = engine.add_request(words(300), GREEDY)
    small = engine.add_request(words(20, 1), GREEDY)
    while engine.has_unfinished():
        engine.step()
    assert engine.take(big).error.startswith("request needs more pages than the cache can free")
    assert engine.take(small).finish_reason == "length"
    assert [f.request_id for f in failed] == [big]
    drain_and_flush(engine)


def test_an_exception_in_one_batch_fails_its_requests_and_the_engine_goes_on(monkeypatch, capsys):
    engine = make_engine()
    rid = engine.add_request(words(20), GREEDY)
    real = engine.model.forward
    monkeypatch.setattr(engine.model, "forward", lambda items: 1 / 0)
    engine.step()
    monkeypatch.setattr(engine.model, "forward", real)
    assert "ZeroDivisionError" in engine.take(rid).error
    assert engine.generate([words(20, 1)], GREEDY)[0].finish_reason == "length"
    drain_and_flush(engine)


def test_lifecycle_events_arrive_in_order():
    engine = make_engine(chunk=16)
    log = []
    for kind in (RequestAdded, RequestScheduled, PrefillChunk, TokensGenerated, RequestFinished):
        engine.events.subscribe(kind, lambda e: log.append(type(e).__name__))
    engine.generate([words(40)], SamplingParams(max_tokens=3))
    assert log == [
        "RequestAdded",
        "RequestScheduled",
        "PrefillChunk",
        "PrefillChunk",
        "PrefillChunk",
    ] + ["TokensGenerated"] * 3 + ["RequestFinished"]


def test_second_turn_reports_cached_prompt_tokens():
    engine = make_engine()
    prompt = words(100)
    first = engine.generate([prompt], GREEDY)[0]
    assert first.cached_tokens == 0
    second = engine.generate([prompt + first.token_ids + words(20, 1)], GREEDY)[0]
    assert second.cached_tokens >= 96


def test_sampling_is_reproducible_with_a_seed():
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=42)
    a = make_engine().generate([words(30)], params)[0].token_ids
    b = make_engine().generate([words(30)], params)[0].token_ids
    assert a == b and len(a) == 10


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([], "empty"),
        ([999], "token ids must be"),
        (list(range(100)) * 41, "max_model_len"),
        ("bad \ud800 surrogate", "not valid Unicode"),
    ],
)
def test_bad_prompts_are_rejected_as_invalid_and_change_nothing(prompt, message):
    engine = make_engine()
    with pytest.raises(EngineError, match=message) as refused:
        engine.add_request(prompt)
    assert refused.value.kind is ErrorKind.INVALID and refused.value.code == "invalid_prompt"
    assert isinstance(refused.value, ValueError)  # callers that catch ValueError still do
    assert engine.request_ids() == () and not engine.has_unfinished()


def test_bad_sampling_params_and_duplicate_ids_are_rejected():
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    engine = make_engine()
    engine.add_request([1, 2, 3], request_id="x")
    with pytest.raises(EngineError, match="already in use") as taken:
        engine.add_request([1, 2, 3], request_id="x")
    assert taken.value.kind is ErrorKind.CONFLICT and engine.request_ids() == ("x",)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device here")
def test_runs_on_cuda():
    engine = Engine(EngineConfig(device="cuda", cache=small_cache()))
    cpu = make_engine()
    prompt = words(50)
    assert (
        engine.generate([prompt], GREEDY)[0].token_ids
        == cpu.generate([prompt], GREEDY)[0].token_ids
    )
