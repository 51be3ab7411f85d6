"""Layer math on plain tensors. Shapes: n tokens, H heads, D head dim, d model dim."""

from __future__ import annotations

from collections.abc import Collection

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding of (n, H, D) at absolute ``positions`` (n,)."""
    half = x.shape[-1] // 2
    freqs = theta ** (-torch.arange(half, dtype=x.dtype, device=x.device) / half)
    angles = positions.to(x.dtype)[:, None] * freqs[None, :]  # (n, half)
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    window: int | None,
) -> torch.Tensor:
    """Causal softmax attention of queries (n, H, D) over keys (T, H, D).

    A query at position p sees keys at positions <= p, and with a window W only
    those > p - W (W keys, itself included).
    """
    scores = torch.einsum("nhd,thd->hnt", q, k) * q.shape[-1] ** -0.5
    visible = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        visible &= k_pos[None, :] > q_pos[:, None] - window
    scores = scores.masked_fill(~visible[None], float("-inf"))
    return torch.einsum("hnt,thd->nhd", scores.softmax(-1), v)


def linear_scan(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    decay: torch.Tensor,
    state: torch.Tensor,
    keep: Collection[int],
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """Decayed linear attention, one token at a time from ``state`` (H, D, D).

    S_t = decay * S_{t-1} + k_t^T v_t and o_t = q_t S_t, with elu + 1 feature
    maps on q and k. Returns the outputs (n, H, D) and the states after the
    first ``i`` tokens for every ``i`` in ``keep`` (1 <= i <= n). Stepping token
    by token makes a state depend only on the tokens before it, never on how
    they were chunked.
    """
    q, k = F.elu(q) + 1, F.elu(k) + 1
    g = decay[:, None, None]
    out = torch.empty_like(v)
    kept = {}
    for t in range(q.shape[0]):
        state = g * state + k[t, :, :, None] * v[t, :, None, :]
        out[t] = (q[t, :, None, :] @ state).squeeze(1)
        if t + 1 in keep:
            kept[t + 1] = state
    return out, kept


def moe(
    x: torch.Tensor,
    router: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    top_k: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routed SwiGLU experts; returns the output and the routed expert ids (n, k)."""
    weights, ids = (x @ router.T).topk(top_k, dim=-1)
    weights = weights.softmax(-1)
    y = torch.zeros_like(x)
    for e in range(router.shape[0]):
        rows, slot = (ids == e).nonzero(as_tuple=True)
        if rows.numel():
            h = x[rows]
            out = (F.silu(h @ w_gate[e].T) * (h @ w_up[e].T)) @ w_down[e].T
            y.index_add_(0, rows, out * weights[rows, slot, None])
    return y, ids
