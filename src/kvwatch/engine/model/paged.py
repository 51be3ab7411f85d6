"""PagedKV and PagedBatch: views of the cache pools during a forward.

A ``PagedKV`` is one sequence's page tables; a ``PagedBatch`` gathers the
slot indices of several sequences that compute the same number of tokens, so
a layer writes and reads all of them with one scatter and one gather. The
model never sees page ids. Entry layouts (one row per token slot of a pool)::

    full.kv       (n_F, 2, H, D)      K and V of every F layer
    swa.kv        (n_S, 2, H, D)      K and V of every S layer (last W positions only)
    swa.window    (n_S, 2, H, D)      the same, in a continuation snapshot
    linear.state  (n_L, H, D, D)      one slot per page: the recurrent state
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
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

    def full_slots(self, start: int, end: int) -> np.ndarray:
        """Flat ``full.kv`` slots of tokens [start, end)."""
        return self.full.token_slots(self.full_table, start, end - start)

    def swa_slots(self, start: int, end: int) -> np.ndarray:
        """Flat ``swa.kv`` slots of tokens [start, end); only window pages are mapped."""
        ps = self.swa.page_size
        first = start // ps
        pages = [self.swa_table[j] for j in range(first, math.ceil(end / ps))]
        return self.swa.token_slots(pages, start - first * ps, end - start)

    def write_experts(self, start: int, experts: torch.Tensor) -> None:
        """Routed expert ids (n, n_layers, top_k) of tokens [start, start + n)."""
        self.full.write_aux(EXPERTS, self.full_table, start, experts)


class PagedBatch:
    """B sequences that each compute n new tokens, viewed through their pages.

    Sequence b computes tokens [s_b, s_b + n). Its reads are padded on the
    right to the longest in the batch; ``*_valid`` marks the real keys::

        full.kv   write [s_b, e_b)                read [0, e_b)        e_b = s_b + n
        swa.kv    write [s_b, e_b)                read [lo_b, e_b)     lo_b = max(0, s_b - W + 1)
        pad       repeats the sequence's first slot (finite data, masked out)

    Writes never overlap between sequences: each writes only its own
    uncommitted pages, so one scatter for the batch equals one per sequence.
    """

    def __init__(self, kvs: Sequence[PagedKV], starts: Sequence[int], n: int, window: int):
        first = kvs[0]
        self.full, self.swa, self.linear = first.full, first.swa, first.linear
        device = self.full.data.device
        ends = [s + n for s in starts]
        lows = [max(0, s - window + 1) for s in starts]
        seqs = list(zip(kvs, starts, ends, lows, strict=True))
        self.full_write = _index([kv.full_slots(s, e) for kv, s, e, _ in seqs], device)
        self.swa_write = _index([kv.swa_slots(s, e) for kv, s, e, _ in seqs], device)
        self.full_read, self.full_pos, self.full_valid = _padded(
            [kv.full_slots(0, e) for kv, _, e, _ in seqs], [0] * len(seqs), device
        )
        self.swa_read, self.swa_pos, self.swa_valid = _padded(
            [kv.swa_slots(lo, e) for kv, _, e, lo in seqs], lows, device
        )
        self.state_pages = torch.tensor([kv.state_page for kv in kvs], device=device)

    def write_full(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """K and V (B * n, H, D), sequence-major."""
        self.full.tokens[self.full_write, layer] = torch.stack([k, v], dim=1)

    def read_full(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        kv = self.full.tokens[self.full_read, layer]  # (B, T, 2, H, D)
        return kv[:, :, 0], kv[:, :, 1]

    def write_swa(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.swa.tokens[self.swa_write, layer] = torch.stack([k, v], dim=1)

    def read_swa(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        kv = self.swa.tokens[self.swa_read, layer]
        return kv[:, :, 0], kv[:, :, 1]

    def load_states(self, layer: int) -> torch.Tensor:
        """The working linear states (B, H, D, D)."""
        return self.linear.tokens[self.state_pages, layer]


def _index(slots: list[np.ndarray], device) -> torch.Tensor:
    return torch.from_numpy(np.concatenate(slots)).to(device)


def _padded(
    slots: list[np.ndarray], firsts: list[int], device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, T) slot indices, key positions and validity of ragged slot runs."""
    width = max(len(s) for s in slots)
    index = np.empty((len(slots), width), dtype=np.int64)
    for b, run in enumerate(slots):
        index[b, : len(run)] = run
        index[b, len(run) :] = run[0]
    lengths = torch.tensor([len(s) for s in slots])
    offsets = torch.arange(width)
    positions = torch.tensor(firsts)[:, None] + offsets[None, :]
    valid = offsets[None, :] < lengths[:, None]
    return torch.from_numpy(index).to(device), positions.to(device), valid.to(device)
