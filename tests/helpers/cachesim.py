"""A stand-in for the model runner that writes checkable values into the cache.

Every position p of a sequence gets the value ``h(extra_key, tokens[:p + 1])``,
a rolling hash of its prefix. That is what real K/V is: a function of the
prefix alone. So any page, window or state can be checked against the tokens
it claims to describe.
"""

from __future__ import annotations

import torch

from kvwatch.engine.cache.holder import Holder
from kvwatch.engine.cache.node import Node, Tier
from kvwatch.engine.cache.pool import PageLayout, PagePool
from kvwatch.engine.cache.protocol import Capture, Handle, ServedCache, holder_of
from kvwatch.engine.config import (
    FULL_KV,
    GROUP_NAMES,
    LINEAR_STATE,
    SWA_KV,
    SWA_WINDOW,
    CacheConfig,
    GroupSpec,
)

MOD = (1 << 61) - 1
BASE = 1_000_003
INT_LAYOUTS = {g: PageLayout((), torch.int64) for g in GROUP_NAMES}


def cache_config(
    *,
    window: int,
    interval: int,
    page: int,
    full: int,
    swa: int,
    snapshots: int,
    host: int = 0,
) -> CacheConfig:
    """A config whose history groups share one page size and whose two state
    groups hold ``snapshots`` snapshots each (plus ``host`` on the host tier)."""
    per_window = -(-window // page)
    return CacheConfig(
        window=window,
        snapshot_interval=interval,
        full_kv=GroupSpec(name=FULL_KV, page_size=page, capacity=full),
        swa_kv=GroupSpec(name=SWA_KV, page_size=page, capacity=swa),
        swa_window=GroupSpec(
            name=SWA_WINDOW,
            page_size=page,
            capacity=snapshots * per_window,
            host_capacity=host * per_window,
        ),
        linear_state=GroupSpec(
            name=LINEAR_STATE, page_size=1, capacity=snapshots, host_capacity=host
        ),
    )


def seed_of(extra_key: str | None) -> int:
    return (
        7 if extra_key is None else 11 + sum(ord(c) * 31**i for i, c in enumerate(extra_key)) % MOD
    )


def prefix_values(
    tokens: list[int], extra_key: str | None, start_hash: int | None = None
) -> list[int]:
    h = seed_of(extra_key) if start_hash is None else start_hash
    out = []
    for t in tokens:
        h = (h * BASE + t + 1) % MOD
        out.append(h)
    return out


def swa_slots(swa: dict[int, int], page_size: int, start: int, n: int) -> tuple[list[int], int]:
    """The swa.kv pages of a page table's window that hold positions [start, start + n),
    and the offset of ``start`` in the first."""
    first, end = start // page_size, -(-(start + n) // page_size)
    return [swa[j] for j in range(first, end)], start % page_size


class SimRunner:
    """Drives holders through allocate -> write -> advance like the engine does.

    It reads the cache the way the model does (``page_table``, ``pools``) and
    its snapshots through the read-only ``view``."""

    def __init__(self, cache: ServedCache) -> None:
        self.cache = cache

    def values(self, h: Handle) -> list[int]:
        holder = holder_of(h)
        return prefix_values(holder.tokens, holder.extra_key)

    def compute(self, h: Handle, n: int) -> None:
        """Compute the next ``n`` tokens (the caller made sure they exist)."""
        cache = self.cache
        start, end = h.computed_len, h.computed_len + n
        assert end <= len(holder_of(h).tokens)
        cache.allocate(h, n)
        vals = torch.tensor(self.values(h)[start:end], dtype=torch.int64)
        self.write(h, start, vals)
        hashes = self.values(h)
        captures = [
            Capture(b, kind, torch.tensor(hashes[b - 1]))
            for b, kind in cache.capture_points(h, start, end)
        ]
        cache.advance(h, end, captures)
        cache.set_working_state(h, hashes[end - 1])

    def write(self, h: Handle, start: int, vals: torch.Tensor) -> None:
        cache, table = self.cache, self.cache.page_table(h)
        cache.pools[FULL_KV].write_tokens(table.full, start, vals)
        swa = cache.pools[SWA_KV]
        pages, offset = swa_slots(table.swa, swa.page_size, start, len(vals))
        swa.write_tokens(pages, offset, vals)

    # -- checks ---------------------------------------------------------------------
    def check_holder(self, h: Handle | Holder) -> None:
        """The holder's pages and working state describe exactly its own tokens."""
        cache = self.cache
        holder = h if isinstance(h, Holder) else holder_of(h)
        table = cache.page_table(holder.handle)
        c = holder.computed_len
        if c == 0:
            assert int(cache.pools[LINEAR_STATE].page_data([table.linear]).item()) == 0
            return
        hashes = self.values(holder.handle)[:c]
        got = cache.pools[FULL_KV].read_tokens(table.full, 0, c).tolist()
        assert got == hashes, f"holder {holder.id}: full.kv differs from its tokens"
        lo = max(0, c - cache.view.config.window)
        swa = cache.pools[SWA_KV]
        pages, offset = swa_slots(table.swa, swa.page_size, lo, c - lo)
        got = swa.read_tokens(pages, offset, c - lo).tolist()
        assert got == hashes[lo:], f"holder {holder.id}: swa window differs from its tokens"
        state = int(cache.pools[LINEAR_STATE].page_data([table.linear]).item())
        assert state == hashes[-1], f"holder {holder.id}: working state is not the state at {c}"
        for b, pend in holder.pending.items():
            self._check_snapshot(
                pend.pages, Tier.DEVICE, hashes[:b], f"holder {holder.id} pending {b}"
            )

    def tree_prefixes(self) -> dict[tuple, int]:
        """Every cached page keyed by its prefix, checking page and snapshot contents."""
        cache, p = self.cache, self.cache.page_size
        out: dict[tuple, int] = {}
        stack: list[tuple[Node, tuple, list[int]]] = [
            (child, (), []) for child in cache.view.tree.root.children.values()
        ]
        while stack:
            node, prefix, vals = stack.pop()
            tokens = prefix + tuple(node.tokens)
            start = vals[-1] if vals else None
            mine = prefix_values(list(node.tokens), node.extra_key, start)
            got = (
                cache.pools[FULL_KV].read_tokens(node.pages.tolist(), 0, len(node.tokens)).tolist()
            )
            assert got == mine, f"node {node.id}: pages hold another prefix's values"
            for k, page in enumerate(node.pages.tolist()):
                out[(node.extra_key, tokens[: node.start + (k + 1) * p])] = page
            full_vals = vals + mine
            if node.snapshot is not None and node.snapshot.pages:
                self._check_snapshot(
                    node.snapshot.pages, node.snapshot.tier, full_vals, f"node {node.id}"
                )
            stack.extend((child, tokens, full_vals) for child in node.children.values())
        return out

    def _pool(self, group: str, tier: Tier) -> PagePool:
        view = self.cache.view
        return (view.pools if tier is Tier.DEVICE else view.host_pools)[group]

    def _check_snapshot(self, pages, tier: Tier, hashes: list[int], what: str) -> None:
        w = self.cache.view.config.window
        linear = self._pool(LINEAR_STATE, tier)
        assert int(linear.page_data(pages[LINEAR_STATE]).item()) == hashes[-1], (
            f"{what}: linear state"
        )
        window = self._pool(SWA_WINDOW, tier).read_tokens(pages[SWA_WINDOW], 0, w).tolist()
        want = [0] * max(0, w - len(hashes)) + hashes[-w:]
        assert window == want, f"{what}: swa window snapshot"


def run_turn(
    sim: SimRunner, holder: Handle, new_tokens: list[int], *, chunk: int, decode: list[int]
) -> None:
    """One turn the way the engine runs it: append the user's tokens, prefill them in
    chunks, decode ``decode`` one token at a time, committing after every step, then
    commit the turn's terminal snapshot."""
    cache, tokens = sim.cache, holder_of(holder).tokens
    tokens += new_tokens
    while holder.computed_len < len(tokens):
        sim.compute(holder, min(chunk, len(tokens) - holder.computed_len))
        cache.commit_chunk(holder)
    for token in decode:
        tokens.append(token)
        sim.compute(holder, 1)
        cache.commit_chunk(holder)
    cache.commit_chunk(holder, terminal=True)
