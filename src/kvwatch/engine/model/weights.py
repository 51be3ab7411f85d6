"""Random weights from a fixed seed: the same seed gives the same model anywhere."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvwatch.engine.config import ModelConfig


@dataclass(frozen=True)
class LayerWeights:
    kind: str  # "F", "S" or "L"
    attn_norm: torch.Tensor  # (d,)
    wq: torch.Tensor  # (H*D, d)
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor  # (d, H*D)
    decay: torch.Tensor | None  # L layers: per-head decay in (0, 1)
    ffn_norm: torch.Tensor  # (d,)
    router: torch.Tensor  # (E, d)
    w_gate: torch.Tensor  # (E, hidden, d)
    w_up: torch.Tensor  # (E, hidden, d)
    w_down: torch.Tensor  # (E, d, hidden)


@dataclass(frozen=True)
class HybridWeights:
    embed: torch.Tensor  # (V, d)
    layers: tuple[LayerWeights, ...]
    final_norm: torch.Tensor
    lm_head: torch.Tensor  # (V, d)


def init_weights(cfg: ModelConfig, vocab_size: int, device: str) -> HybridWeights:
    gen = torch.Generator().manual_seed(cfg.seed)
    dtype = getattr(torch, cfg.dtype)
    d, hd = cfg.d_model, cfg.n_heads * cfg.head_dim
    depth_scale = (2 * len(cfg.layers)) ** -0.5

    def normal(*shape: int, scale: float) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(device, dtype)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=dtype, device=device)

    layers = []
    for kind in cfg.layers:
        decay = None
        if kind == "L":  # spread the heads' memory from short to long
            decay = torch.linspace(0.80, 0.98, cfg.n_heads, dtype=torch.float64).to(device, dtype)
        e, h = cfg.n_experts, cfg.expert_hidden
        layers.append(
            LayerWeights(
                kind=kind,
                attn_norm=ones(d),
                wq=normal(hd, d, scale=d**-0.5),
                wk=normal(hd, d, scale=d**-0.5),
                wv=normal(hd, d, scale=d**-0.5),
                wo=normal(d, hd, scale=hd**-0.5 * depth_scale),
                decay=decay,
                ffn_norm=ones(d),
                router=normal(e, d, scale=d**-0.5),
                w_gate=normal(e, h, d, scale=d**-0.5),
                w_up=normal(e, h, d, scale=d**-0.5),
                w_down=normal(e, d, h, scale=h**-0.5 * depth_scale),
            )
        )
    return HybridWeights(
        embed=normal(vocab_size, d, scale=1.0),
        layers=tuple(layers),
        final_norm=ones(d),
        lm_head=normal(vocab_size, d, scale=4 * d**-0.5),
    )
