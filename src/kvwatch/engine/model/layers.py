"""Layer math on plain tensors. Shapes: B sequences, n tokens, H heads, D head dim, d model dim."""

from __future__ import annotations

from collections.abc import Collection, Sequence

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
    k_valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal softmax attention of queries (B, n, H, D) over keys (B, T, H, D).

    A query at position p sees keys at positions <= p, and with a window W only
    those > p - W (W keys, itself included). Positions are (B, n) and (B, T).
    ``k_valid`` (B, T) marks real keys; padding keys get weight exactly 0, so a
    sequence's output does not depend on what it was batched with.
    """
    scores = torch.einsum("bnhd,bthd->bhnt", q, k) * q.shape[-1] ** -0.5
    visible = k_pos[:, None, :] <= q_pos[:, :, None]  # (B, n, T)
    if window is not None:
        visible &= k_pos[:, None, :] > q_pos[:, :, None] - window
    if k_valid is not None:
        visible &= k_valid[:, None, :]
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    return torch.einsum("bhnt,bthd->bnhd", scores.softmax(-1), v)


def linear_scan(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    decay: torch.Tensor,
    state: torch.Tensor,
    keep: Sequence[Collection[int]],
) -> tuple[torch.Tensor, list[dict[int, torch.Tensor]]]:
    """Decayed linear attention over (B, n, H, D), one token at a time from ``state`` (B, H, D, D).

    S_t = decay * S_{t-1} + k_t^T v_t and o_t = q_t S_t, with elu + 1 feature
    maps on q and k. Returns the outputs (B, n, H, D) and, per sequence b, the
    states after its first ``i`` tokens for every ``i`` in ``keep[b]``
    (1 <= i <= n). Stepping token by token makes a state depend only on the
    tokens before it, never on how they were chunked or batched.
    """
    q, k = F.elu(q) + 1, F.elu(k) + 1
    g = decay[:, None, None]
    out = torch.empty_like(v)
    kept: list[dict[int, torch.Tensor]] = [{} for _ in keep]
    for t in range(q.shape[1]):
        state = g * state + k[:, t, :, :, None] * v[:, t, :, None, :]
        out[:, t] = (q[:, t, :, None, :] @ state).squeeze(-2)
        for b, wanted in enumerate(keep):
            if t + 1 in wanted:
                kept[b][t + 1] = state[b]
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
