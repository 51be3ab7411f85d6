"""The ``--engine vllm-scheduler`` profiles that turn on the KV cache layouts users turn on.

Each profile names its ``kv_layout.Layout`` in its settings (the driver
builds it through vLLM's own specs and resolution, ``kv_groups.py``) and a
load that reaches what that layout adds. All four publish KV cache events,
which ``event_ledger.py`` checks after every step:

``mid-block-prefix``
    full attention beside a Mamba group (cache mode ``align``), 64-token
    blocks, ``prefix_match_unit`` 16: prompt tails are cached as partial-block
    entries (``BlockPool.cache_partial_block``) and prefix hits land inside
    blocks, served through a copy-on-write block. A 40-token system prompt
    ends inside the first block; each turn every conversation sends it with a
    question of its own, a reader sends its first 33 tokens, and each
    conversation's earlier text comes back with a follow-up, which fills the
    block (a partial entry promoted to a full one). Hashes must be those of
    the tokens at the boundary each key covers (``partial-hash-span``,
    ``block-hash-vs-tokens``, ``hit-on-other-tokens``).
``hybrid-swa``
    full attention beside a 32-token sliding window, 16-token blocks: long
    decodes let the window's early blocks go (null slots); a second wave hits
    the shared prefix in both groups; one request a turn is aborted mid-decode.
``hybrid-mamba``
    full attention beside a Mamba ``align`` group, 32-token blocks, a pool
    tight enough that a turn's requests preempt each other; a shared prefix
    hit at block boundaries in both groups.
``kv-events``
    one full-attention group, a pool that a turn's prompts overflow (cached
    blocks evicted, each eviction a ``BlockRemoved``), identical prompts sent
    together, an abort mid-prefill, and a prefix-cache reset at idle after
    turn 1 (``AllBlocksCleared``).
"""

from __future__ import annotations

from typing import ClassVar

from kvwatch.targets.vllm.kv_layout import Layout
from kvwatch.targets.vllm.workloads import Workload


class MidBlockPrefix(Workload):
    name = "mid-block-prefix"
    summary = "prefix hashes finer than blocks: shared prefixes that end inside a block"
    LAYOUT = Layout(groups=("full", "mamba"), block_size=64, prefix_match_unit=16, events=True)
    SYSTEM: ClassVar[list[int]] = list(
        range(3000, 3040)
    )  # 40 tokens: hash boundaries 16 and 32 inside block 0

    def __init__(self, seed: int = 0, steps: int | None = None) -> None:
        super().__init__(seed, steps)
        self.said: dict[int, list[int]] = {}  # conversation -> its text after its last turn

    def settings(self, concurrency: int) -> dict:
        blocks = 2 * (6 + 3 * concurrency) + 1  # two groups share the pool
        return {"block_size": 64, "num_blocks": blocks, "layout": self.LAYOUT}

    def turn(self, core, turn: int, concurrency: int) -> None:
        for i in range(concurrency):
            ask = [4000 + 97 * i + 13 * turn + k for k in range(5 + (i + turn) % 9)]
            core.submit(f"ask-{turn}-{i}", self.SYSTEM + ask, 6)
        core.submit(f"reader-{turn}", self.SYSTEM[:33], 2)
        for i, said in sorted(self.said.items()):
            more = [6000 + 31 * i + turn + k for k in range(11)]
            core.submit(f"follow-{turn}-{i}", said + more, 4)
        core.run()
        for i in range(concurrency):
            self.said[i] = self.SYSTEM + [4000 + 97 * i + 13 * turn + k for k in range(20)]


class HybridSwa(Workload):
    name = "hybrid-swa"
    summary = "full attention beside a sliding window: windows let blocks go, prefixes hit both"
    LAYOUT = Layout(groups=("full", "swa"), block_size=16, window=32, events=True)

    def settings(self, concurrency: int) -> dict:
        blocks = 2 * (12 + 8 * concurrency) + 1
        return {"block_size": 16, "num_blocks": blocks, "layout": self.LAYOUT}

    def turn(self, core, turn: int, concurrency: int) -> None:
        shared = list(range(8000 + turn, 8000 + turn + 48))
        for wave in range(2):
            for i in range(concurrency):
                own = [9000 + 50 * i + 7 * wave + k for k in range(20 + 3 * i)]
                rid = f"swa-{turn}-{wave}-{i}"
                core.submit(rid, shared + own, 40 - 10 * wave)
            for _ in range(3):
                core.step()
            core.abort(f"swa-{turn}-{wave}-0")
            core.run()


class HybridMamba(Workload):
    name = "hybrid-mamba"
    summary = "full attention beside a Mamba group: block-boundary hits, preemption on a tight pool"
    LAYOUT = Layout(groups=("full", "mamba"), block_size=32, events=True)

    def settings(self, concurrency: int) -> dict:
        blocks = 2 * (2 + 2 * concurrency) + 1
        return {"block_size": 32, "num_blocks": blocks, "layout": self.LAYOUT}

    def turn(self, core, turn: int, concurrency: int) -> None:
        shared = list(range(11000, 11064))
        for i in range(concurrency):
            own = [12000 + 100 * i + 10 * turn + k for k in range(6 + 5 * i)]
            core.submit(f"mamba-{turn}-{i}", shared + own, 60)
        core.run()


class KvEvents(Workload):
    name = "kv-events"
    summary = "events: evictions from an overflowing pool, twin prompts, an abort, a reset"
    LAYOUT = Layout(groups=("full",), block_size=16, events=True)

    def settings(self, concurrency: int) -> dict:
        return {"block_size": 16, "num_blocks": 16 + 2 * concurrency, "layout": self.LAYOUT}

    def turn(self, core, turn: int, concurrency: int) -> None:
        for i in range(concurrency):
            twin = i // 2  # two conversations at a time send the same prompt
            tokens = list(
                range(20000 + 1000 * turn + 100 * twin, 20000 + 1000 * turn + 100 * twin + 36)
            )
            core.submit(f"ev-{turn}-{i}", tokens, 8)
        long = list(range(30000 + 1000 * turn, 30000 + 1000 * turn + 200))
        core.submit(f"cut-{turn}", long, 4)
        core.step()
        core.abort(f"cut-{turn}")
        core.run()
        if turn == 1:
            core.scheduler.reset_prefix_cache()


LAYOUT_WORKLOADS: dict[str, type[Workload]] = {
    w.name: w for w in (MidBlockPrefix, HybridSwa, HybridMamba, KvEvents)
}
