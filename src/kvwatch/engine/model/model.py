"""HybridModel: the forward pass of a batch of sequence chunks over paged pools.

Each item computes tokens [start, start + n) of one sequence. Dense work
(projections, experts, logits) runs on all items' tokens at once. Token
mixing runs once per group of items with the same n (every decode step is
one group) against their pages, through a ``PagedBatch``::

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
from kvwatch.engine.model.paged import PagedBatch, PagedKV
from kvwatch.engine.model.tokenizer import VOCAB_SIZE
from kvwatch.engine.model.weights import init_weights


class ForwardItem(NamedTuple):
    tokens: list[int]  # ids of positions [start, start + len(tokens))
    start: int
    kv: PagedKV
    state_points: frozenset[int]  # boundaries b in (start, end]: return L states after b tokens
    logit_positions: tuple[int, ...]  # positions whose next-token logits are wanted


class Group(NamedTuple):
    """Items with the same chunk length n, mixed as one batch."""

    members: list[int]  # item indices
    starts: list[int]
    rows: torch.Tensor  # (B, n) rows of the items' tokens in the flat batch
    q_pos: torch.Tensor  # (B, n) their positions
    batch: PagedBatch
    keep: list[set[int]]  # per item: state boundaries relative to its start


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
        groups = self._groups(items, bounds, pos)
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
            for g in groups:
                out[g.rows] = self._mix(li, layer, g, q[g.rows], k[g.rows], v[g.rows], states)
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

    def _groups(self, items: Sequence[ForwardItem], bounds: list[int], pos) -> list[Group]:
        """Items grouped by chunk length, in order of first appearance."""
        by_length: dict[int, list[int]] = {}
        for i, it in enumerate(items):
            by_length.setdefault(len(it.tokens), []).append(i)
        groups = []
        for n, members in by_length.items():
            rows = torch.tensor([[bounds[i] + t for t in range(n)] for i in members])
            rows = rows.to(self.device)
            starts = [items[i].start for i in members]
            batch = PagedBatch([items[i].kv for i in members], starts, n, self.window)
            keep = [{b - items[i].start for b in items[i].state_points} for i in members]
            groups.append(
                Group(
                    members=members,
                    starts=starts,
                    rows=rows,
                    q_pos=pos[rows],
                    batch=batch,
                    keep=keep,
                )
            )
        return groups

    def _mix(self, li: int, layer, g: Group, q, k, v, states: list[dict]) -> torch.Tensor:
        """Token mixing of one layer for one group, through its pages: (B, n, H, D)."""
        slot, batch = self.slot[li], g.batch
        if layer.kind == "F":
            batch.write_full(slot, k.flatten(0, 1), v.flatten(0, 1))
            keys, values = batch.read_full(slot)
            return attend(q, keys, values, g.q_pos, batch.full_pos, None, batch.full_valid)
        if layer.kind == "S":
            batch.write_swa(slot, k.flatten(0, 1), v.flatten(0, 1))
            keys, values = batch.read_swa(slot)
            return attend(q, keys, values, g.q_pos, batch.swa_pos, self.window, batch.swa_valid)
        out, kept = linear_scan(q, k, v, layer.decay, batch.load_states(slot), g.keep)
        for i, start, per_item in zip(g.members, g.starts, kept, strict=True):
            for rel, s in per_item.items():
                states[i].setdefault(start + rel, []).append(s)
        return out
