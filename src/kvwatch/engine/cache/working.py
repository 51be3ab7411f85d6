"""WorkingState: a holder's own continuation state, and copies in and out of it.

A running holder keeps the last W positions of ``swa.kv`` in its own pages and
one ``linear.state`` page (its working state). A snapshot at boundary b is the
same pair frozen::

    swa.kv      [ b - W ............ b )   ──write_snapshot──►  swa.window page(s)
    working     linear state after b - 1   ──write_snapshot──►  linear.state page
                                           ◄──restore_state───

Positions below 0 are zero-padded in the window. Both directions copy, so a
snapshot and a holder never share a page.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch

from kvwatch.engine.cache.holder import Holder
from kvwatch.engine.cache.pool import PagePool
from kvwatch.engine.config import LINEAR_STATE, SWA_KV, SWA_WINDOW


class WorkingState:
    """Copies between holders' working pages and snapshot pages, in the device pools."""

    def __init__(self, pools: Mapping[str, PagePool], window: int) -> None:
        self.pools = pools
        self.window = window

    def restore_state(self, holder: Holder, snapshot: dict[str, np.ndarray] | None, d: int) -> None:
        """Copy a device snapshot taken at ``d`` into the holder's own working pages.

        The linear state goes to the working page, the window's tokens to
        ``swa.kv`` positions [d - W, d), whose pages the holder already has.
        ``None`` is the state before any token: all zeros.
        """
        linear = self.pools[LINEAR_STATE]
        if snapshot is None:
            linear.set_page_data(holder.working[LINEAR_STATE], 0)
            return
        linear.copy_pages(snapshot[LINEAR_STATE], linear, holder.working[LINEAR_STATE])
        first = max(0, d - self.window)
        n = d - first
        window = self.pools[SWA_WINDOW].read_tokens(snapshot[SWA_WINDOW], self.window - n, n)
        self._write_swa(holder, first, window)

    def write_snapshot(
        self, holder: Holder, pages: dict[str, np.ndarray], b: int, linear_state: torch.Tensor
    ) -> None:
        """Write the continuation state at ``b`` into snapshot pages: the last W
        tokens of ``swa.kv`` (zero-padded below position 0) and the linear state."""
        w = self.window
        n = min(b, w)
        window = self.pools[SWA_WINDOW]
        if n < w:
            pad = torch.zeros((w - n, *window.layout.token_shape), dtype=window.layout.dtype)
            window.write_tokens(pages[SWA_WINDOW], 0, pad)
        window.write_tokens(pages[SWA_WINDOW], w - n, self._read_swa(holder, b - n, n))
        self.pools[LINEAR_STATE].write_tokens(pages[LINEAR_STATE], 0, linear_state.unsqueeze(0))

    def set_working_state(self, holder: Holder, state: torch.Tensor) -> None:
        """Overwrite the holder's working linear state (one page entry)."""
        self.pools[LINEAR_STATE].set_page_data(holder.working[LINEAR_STATE], state)

    def swa_page_range(self, start: int, end: int) -> range:
        ps = self.pools[SWA_KV].page_size
        return range(start // ps, math.ceil(end / ps)) if end > start else range(0)

    def swa_table(self, holder: Holder, start: int, n: int) -> tuple[list[int], int]:
        """Pages and in-page offset that hold ``swa.kv`` positions [start, start + n)."""
        ps = self.pools[SWA_KV].page_size
        pages = [holder.swa_pages[j] for j in self.swa_page_range(start - start % ps, start + n)]
        return pages, start % ps

    def _read_swa(self, holder: Holder, start: int, n: int) -> torch.Tensor:
        pages, offset = self.swa_table(holder, start, n)
        return self.pools[SWA_KV].read_tokens(pages, offset, n)

    def _write_swa(self, holder: Holder, start: int, values: torch.Tensor) -> None:
        pages, offset = self.swa_table(holder, start, values.shape[0])
        self.pools[SWA_KV].write_tokens(pages, offset, values)
