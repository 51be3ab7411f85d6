"""A dense reference forward: the whole sequence at once, no pages, no chunks.

It uses the model's own weights and layer functions, so any difference from
the engine comes from paged execution: K/V written to and read from pages,
the sliding window, chunk boundaries, snapshot restores.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kvwatch.engine.model.layers import attend, linear_scan, moe, rms_norm, rope
from kvwatch.engine.model.model import HybridModel


class Dense(NamedTuple):
    logits: torch.Tensor  # (n, V): next-token logits after each position
    states: torch.Tensor  # (n_L, H, D, D): linear states after all n tokens
    window_kv: torch.Tensor  # (min(n, W), n_S, 2, H, D): S-layer K/V of the last W positions


@torch.inference_mode()
def dense_forward(model: HybridModel, tokens: list[int]) -> Dense:
    cfg, w = model.cfg, model.weights
    n = len(tokens)
    pos = torch.arange(n)
    x = w.embed[torch.tensor(tokens)]
    states, window = [], []
    for layer in w.layers:
        h = rms_norm(x, layer.attn_norm)
        shape = (n, cfg.n_heads, cfg.head_dim)
        q, k, v = (
            (h @ layer.wq.T).view(shape),
            (h @ layer.wk.T).view(shape),
            (h @ layer.wv.T).view(shape),
        )
        if layer.kind != "L":
            q, k = rope(q, pos, cfg.rope_theta), rope(k, pos, cfg.rope_theta)
        if layer.kind == "F":
            out = attend(q[None], k[None], v[None], pos[None], pos[None], None)[0]
        elif layer.kind == "S":
            out = attend(q[None], k[None], v[None], pos[None], pos[None], model.window)[0]
            window.append(torch.stack([k, v], dim=1)[-model.window :])
        else:
            zero = torch.zeros(1, cfg.n_heads, cfg.head_dim, cfg.head_dim, dtype=x.dtype)
            out, kept = linear_scan(q[None], k[None], v[None], layer.decay, zero, [{n}])
            out = out[0]
            states.append(kept[0][n])
        x = x + out.reshape(n, -1) @ layer.wo.T
        y, _ = moe(
            rms_norm(x, layer.ffn_norm),
            layer.router,
            layer.w_gate,
            layer.w_up,
            layer.w_down,
            cfg.top_k,
        )
        x = x + y
    logits = rms_norm(x, w.final_norm) @ w.lm_head.T
    return Dense(logits, torch.stack(states), torch.stack(window, dim=1))


def dense_greedy(model: HybridModel, prompt: list[int], max_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(int(dense_forward(model, tokens).logits[-1].argmax()))
    return tokens[len(prompt) :]
