"""HybridModel: the forward pass of a batch of sequence chunks over paged pools.

Each item computes tokens [start, start + n) of one sequence. Dense work
(projections, experts, logits) runs on all items' tokens at once; attention
and the linear scan run per item against that item's pages::

    F layer   write K/V of the chunk to full.kv, attend over positions [0, end)
    S layer   write K/V to swa.kv, attend over positions (p - W, p]
    L layer   scan from the working state; the states after requested
              boundaries are returned (the runner decides which one to keep)
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple

import torch

from kvwatch.engine.config import ModelConfig
from kvwatch.engine.model.layers import attend, linear_scan, moe, rms_norm, rope
from kvwatch.engine.model.paged import PagedKV
from kvwatch.engine.model.tokenizer import VOCAB_SIZE
from kvwatch.engine.model.weights import init_weights


class ForwardItem(NamedTuple):
    tokens: list[int]  # ids of positions [start, start + len(tokens))
    start: int
    kv: PagedKV
    state_points: frozenset[int]  # boundaries b in (start, end]: return L states after b tokens
    logit_positions: tuple[int, ...]  # positions whose next-token logits are wanted


class ForwardResult(NamedTuple):
    logits: torch.Tensor  # (len(logit_positions), V)
    states: dict[int, torch.Tensor]  # b -> (n_L, H, D, D)
    experts: torch.Tensor  # (n, n_layers, top_k) routed expert ids of the computed tokens


class HybridModel:
    def __init__(self, cfg: ModelConfig, window: int, device: str = "cpu") -> None:
        self.cfg = cfg
        self.window = window
        self.device = device
        self.vocab_size = VOCAB_SIZE
        self.weights = init_weights(cfg, VOCAB_SIZE, device)
        # Index of each layer among the layers of its kind, i.e. its slot in a page entry.
        self.slot = [cfg.layers[:i].count(kind) for i, kind in enumerate(cfg.layers)]

    @torch.inference_mode()
    def forward(self, items: Sequence[ForwardItem]) -> list[ForwardResult]:
        cfg, w = self.cfg, self.weights
        lengths = [len(it.tokens) for it in items]
        bounds = torch.tensor([0, *lengths]).cumsum(0).tolist()
        spans = [slice(a, b) for a, b in itertools.pairwise(bounds)]
        ids = torch.tensor([t for it in items for t in it.tokens], device=self.device)
        pos = torch.cat(
            [torch.arange(it.start, it.start + n) for it, n in zip(items, lengths, strict=True)]
        )
        pos = pos.to(self.device)
        x = w.embed[ids]
        experts, states = [], [dict() for _ in items]
        for li, layer in enumerate(w.layers):
            h = rms_norm(x, layer.attn_norm)
            shape = (x.shape[0], cfg.n_heads, cfg.head_dim)
            q, k, v = (
                (h @ layer.wq.T).view(shape),
                (h @ layer.wk.T).view(shape),
                (h @ layer.wv.T).view(shape),
            )
            if layer.kind != "L":
                q, k = rope(q, pos, cfg.rope_theta), rope(k, pos, cfg.rope_theta)
            out = torch.empty_like(q)
            for i, (it, sl) in enumerate(zip(items, spans, strict=True)):
                out[sl] = self._mix(li, layer, it, q[sl], k[sl], v[sl], pos[sl], states[i])
            x = x + out.reshape(x.shape[0], -1) @ layer.wo.T
            y, routed = moe(
                rms_norm(x, layer.ffn_norm),
                layer.router,
                layer.w_gate,
                layer.w_up,
                layer.w_down,
                cfg.top_k,
            )
            x = x + y
            experts.append(routed)
        routed_all = torch.stack(experts, dim=1)  # (n_total, n_layers, k)
        rows = [bounds[i] + p - it.start for i, it in enumerate(items) for p in it.logit_positions]
        logits = (
            rms_norm(x[rows], w.final_norm) @ w.lm_head.T if rows else x.new_empty(0, VOCAB_SIZE)
        )
        results, at = [], 0
        for i, it in enumerate(items):
            n_logits = len(it.logit_positions)
            stacked = {b: torch.stack(per_layer) for b, per_layer in states[i].items()}
            results.append(ForwardResult(logits[at : at + n_logits], stacked, routed_all[spans[i]]))
            at += n_logits
        return results

    def _mix(self, li: int, layer, it: ForwardItem, q, k, v, pos, states: dict) -> torch.Tensor:
        """Token mixing of one layer for one item, through its pages."""
        slot, end = self.slot[li], it.start + len(it.tokens)
        if layer.kind == "F":
            it.kv.write_full(slot, it.start, k, v)
            keys, values = it.kv.read_full(slot, end)
            return attend(q, keys, values, pos, torch.arange(end, device=pos.device), None)
        if layer.kind == "S":
            it.kv.write_swa(slot, it.start, k, v)
            lo = max(0, it.start - self.window + 1)
            keys, values = it.kv.read_swa(slot, lo, end)
            return attend(
                q, keys, values, pos, torch.arange(lo, end, device=pos.device), self.window
            )
        keep = {b - it.start for b in it.state_points}
        out, kept = linear_scan(q, k, v, layer.decay, it.kv.load_state(slot), keep)
        for rel, s in kept.items():
            states.setdefault(it.start + rel, []).append(s)
        return out
