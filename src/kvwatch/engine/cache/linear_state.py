"""LinearStatePages: a holder's ``linear.state`` page, the recurrent state of the L layers.

A linear-attention (recurrent) layer carries one fixed-size state forward
token by token; it cannot step backwards. A running holder keeps one page for
it (its *working* state, ``holder.working``), and a snapshot keeps the state
after its boundary's last token in a page of its own::

    working     state after computed_len - 1   ──write_snapshot──►  snapshot page
                                                ◄──restore─────────
    restore(None)  the state before any token: all zeros

Both directions copy, so a snapshot and a holder never share a page.
"""

from __future__ import annotations

import numpy as np
import torch

from kvwatch.engine.cache.holder import Holder
from kvwatch.engine.cache.node import Tier
from kvwatch.engine.cache.storage import CacheStorage
from kvwatch.engine.config import LINEAR_STATE


class LinearStatePages:
    """The ``linear.state`` group's one working page per holder, and its snapshot copies.

    ``enabled`` is False for a backend whose holders keep no state (a model with
    full attention only): then a holder has no working page.
    """

    group = LINEAR_STATE

    def __init__(self, store: CacheStorage, *, enabled: bool = True) -> None:
        self.store = store
        self.pool = store.pools[LINEAR_STATE]
        self.enabled = enabled

    def count(self) -> int:
        """Working pages a holder needs: one, or none when disabled."""
        return int(self.enabled)

    def give(self, holder: Holder, pages: np.ndarray) -> None:
        """The holder's working state: ``pages`` (one entry), or none when disabled."""
        holder.working = {LINEAR_STATE: pages} if self.enabled else {}

    def set(self, holder: Holder, state: torch.Tensor) -> None:
        """Overwrite the holder's working linear state (one page entry)."""
        self.pool.set_page_data(holder.working[LINEAR_STATE], state)

    def reset(self, holder: Holder) -> None:
        """The state before any token: zeros."""
        self.pool.set_page_data(holder.working[LINEAR_STATE], 0)

    def restore(self, holder: Holder, snapshot: dict[str, np.ndarray]) -> None:
        """Copy a snapshot's state into the holder's working page."""
        self.pool.copy_pages(snapshot[LINEAR_STATE], self.pool, holder.working[LINEAR_STATE])

    def write_snapshot(self, pages: dict[str, np.ndarray], linear_state: torch.Tensor) -> None:
        """Write the state after a boundary's last token into a snapshot's page."""
        self.pool.write_tokens(pages[LINEAR_STATE], 0, linear_state.unsqueeze(0))

    def free_working(self, holder: Holder) -> None:
        """Give back the working page; the holder keeps no working state after."""
        self.store.free_groups(holder.working, holder.owner, Tier.DEVICE)
        holder.working = {}

    def entry(self, holder: Holder) -> int:
        """The working page's id, -1 when the holder has none."""
        linear = holder.working.get(LINEAR_STATE)
        return int(linear[0]) if linear is not None else -1
