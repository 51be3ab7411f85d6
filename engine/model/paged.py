"""PagedKV: one sequence's view of the cache pools during a forward.

The model reads and writes K/V and recurrent state through it and never sees
page ids. Entry layouts (one row per token slot of a pool)::

    full.kv       (n_F, 2, H, D)      K and V of every F layer
    swa.kv        (n_S, 2, H, D)      K and V of every S layer (last W positions only)
    swa.window    (n_S, 2, H, D)      the same, in a continuation snapshot
    linear.state  (n_L, H, D, D)      one slot per page: the recurrent state
"""

from __future__ import annotations

import math

import torch

from kvwatch.engine.cache.pool import AuxField, PageLayout, PagePool
from kvwatch.engine.config import FULL_KV, LINEAR_STATE, SWA_KV, SWA_WINDOW, ModelConfig

EXPERTS = "routed_experts"


def page_layouts(cfg: ModelConfig) -> dict[str, PageLayout]:
    """Entry shapes of the four pools. ``full.kv`` also keeps each token's routed
    experts, so a cached prefix can report them without being recomputed."""
    dtype = getattr(torch, cfg.dtype)
    h, d = cfg.n_heads, cfg.head_dim
    kv = (cfg.count("S"), 2, h, d)
    experts = AuxField(EXPERTS, (len(cfg.layers), cfg.top_k), torch.int16)
    return {
        FULL_KV: PageLayout((cfg.count("F"), 2, h, d), dtype, (experts,)),
        SWA_KV: PageLayout(kv, dtype),
        SWA_WINDOW: PageLayout(kv, dtype),
        LINEAR_STATE: PageLayout((cfg.count("L"), h, d, d), dtype),
    }


class PagedKV:
    def __init__(
        self,
        pools: dict[str, PagePool],
        full_table: list[int],
        swa_table: dict[int, int],
        state_page: int,
    ) -> None:
        self.full, self.swa, self.linear = pools[FULL_KV], pools[SWA_KV], pools[LINEAR_STATE]
        self.full_table = full_table
        self.swa_table = swa_table
        self.state_page = state_page

    def _swa_index(self, start: int, end: int) -> torch.Tensor:
        ps = self.swa.page_size
        first = start // ps
        pages = [self.swa_table[j] for j in range(first, math.ceil(end / ps))]
        return self.swa.token_index(pages, start - first * ps, end - start)

    def write_full(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        idx = self.full.token_index(self.full_table, start, k.shape[0])
        self.full.tokens[idx, layer] = torch.stack([k, v], dim=1)

    def read_full(self, layer: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        kv = self.full.tokens[self.full.token_index(self.full_table, 0, end), layer]
        return kv[:, 0], kv[:, 1]

    def write_swa(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.swa.tokens[self._swa_index(start, start + k.shape[0]), layer] = torch.stack(
            [k, v], dim=1
        )

    def read_swa(self, layer: int, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        kv = self.swa.tokens[self._swa_index(start, end), layer]
        return kv[:, 0], kv[:, 1]

    def write_experts(self, start: int, experts: torch.Tensor) -> None:
        """Routed expert ids (n, n_layers, top_k) of tokens [start, start + n)."""
        self.full.write_aux(EXPERTS, self.full_table, start, experts)

    def load_state(self, layer: int) -> torch.Tensor:
        return self.linear.tokens[self.state_page, layer]
