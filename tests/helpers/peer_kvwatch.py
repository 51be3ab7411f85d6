"""kvwatch's side of the peer benchmark: one request at a time, as the engine drives it.

``KvwatchSide(prompts, page, pages, hybrid=True)`` is the radix backend the engine
builds (``build_cache``: full attention, sliding window and linear state,
snapshots every ``INTERVAL`` tokens), ``pages`` full.kv pages of ``page``
tokens; ``hybrid=False`` is the same tree for a
full-attention model (``FullAttentionPrefixCache``: every node resumes, no
snapshots). A request goes through the calls the scheduler makes for a
prompt computed in one chunk (engine/scheduler.py ``_apply``)::

    open -> match                                       timed: match
    allocate -> capture_points(start, end) -> advance(end, captures)
    commit_chunk(h) -> release(h, commit=True)          timed: insert

``end`` is the prompt's length: the engine samples the first token with the
prompt's last one, so after that step every prompt token is computed. Each
capture carries a state tensor (the runner's linear state there); the
window and linear snapshots are copied into pages as in a served request.
``finish`` times ``flush`` (evict-all) and checks that the tree is empty and
every page free.
"""

from __future__ import annotations

import torch
from cachesim import cache_config
from peer_timing import OPS, Clock

from kvwatch.engine.cache.audit import audit
from kvwatch.engine.cache.backends import build_cache
from kvwatch.engine.cache.full_backend import FullAttentionPrefixCache
from kvwatch.engine.cache.pool import PageLayout
from kvwatch.engine.cache.protocol import Capture
from kvwatch.engine.config import FULL_KV, GROUP_NAMES, STATE_GROUPS

INTERVAL = 256  # tokens between interval snapshots (the engine's default is 64 tokens)
WINDOW = 32  # sliding-window length of the S layers


class KvwatchSide:
    """kvwatch's radix backend, built as the engine builds it and driven through its protocol."""

    name = "kvwatch"

    def __init__(
        self, prompts: list[tuple[int, ...]], page: int, pages: int, *, hybrid: bool = True
    ) -> None:
        snapshots = sum(len(p) // INTERVAL + 3 for p in prompts)
        config = cache_config(
            window=WINDOW,
            interval=INTERVAL,
            page=page,
            full=pages,
            swa=8192,
            snapshots=snapshots,
        )
        layouts = {g: PageLayout((), torch.float16) for g in GROUP_NAMES}
        if hybrid:
            self.cache = build_cache(config, layouts)
        else:
            self.cache = FullAttentionPrefixCache(config, layouts)
        self.clock = Clock()
        self.hits = self.resumed = 0
        self.state = torch.zeros((), dtype=torch.float16)

    def request(self, prompt: list[int]) -> None:
        cache, clock = self.cache, self.clock
        h = cache.open(prompt)
        m = clock.time("match", cache.match, h)
        self.hits += m.hit_len
        self.resumed += m.resume_len
        start, end = h.computed_len, len(prompt)
        cache.allocate(h, end - start)
        captures = [Capture(b, k, self.state) for b, k in cache.capture_points(h, start, end)]
        cache.advance(h, end, captures)
        clock.time("insert", self._finish, h)

    def _finish(self, h) -> None:
        self.cache.commit_chunk(h)
        self.cache.release(h, commit=True)

    def finish(self) -> None:
        assert audit(self.cache.view).clean
        self.clock.time("evict", self.cache.flush)
        pools = self.cache.pools
        assert all(pools[g].used_count == 0 for g in (FULL_KV, *STATE_GROUPS)), "flush left pages"
        assert self.cache.view.tree.node_count == 0 and audit(self.cache.view).clean

    @property
    def spent(self) -> dict[str, float]:
        return self.clock.spent


assert set(OPS) == {"match", "insert", "evict"}
