"""One trace through kvwatch's cache and an SGLang cache, request by request.

A ``Pairing`` names the two sides and what their hit tokens must agree on:

full
    kvwatch's tree for a full-attention model (``FullAttentionPrefixCache``)
    against SGLang 0.5.23's ``RadixCache``, 16-token pages. Every cached page
    resumes on both sides: hit and resumed tokens agree.
mamba
    kvwatch's hybrid cache (window, linear state, snapshots as the engine
    captures them) against SGLang 0.5.11's ``MambaRadixCache``, 1-token pages
    (the only size that release's cache takes without its extra buffer).
swa
    kvwatch's hybrid cache against SGLang 0.5.11's ``SWARadixCache``,
    16-token pages.

In the hybrid pairings the history the trees match agrees where both keep
every matched page (``swa``); where each may resume differs by design:
kvwatch resumes at its deepest snapshot (every 256 tokens, branch points,
where a request ended), SGLang's SWA cache wherever the window is cached,
its mamba cache only where a request ended. Each side's hit and resumed
tokens are kept (``Replay``) and the benchmark publishes them.

Both sides get pools of the same number of pages: what the trace's tree
holds once every prompt is in it, the longest prompt, and ``SLACK``.
``replay`` runs the trace ``repeats`` times on fresh caches, the side that
goes first alternating every request and every replay, with the cyclic
garbage collector off inside a replay (neither side pays for the other's
garbage); thread CPU time per op is summed over the replays.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any, NamedTuple

from peer_kvwatch import KvwatchSide
from peer_timing import OPS

SLACK = 4096  # pages beyond what the tree and the longest request need, both sides
Side = Any  # request(tokens), finish(), spent, hits, resumed


class Pairing(NamedTuple):
    name: str  # full, mamba, swa
    peer: str  # the SGLang cache and release
    page: int  # tokens per page, both sides
    hybrid: bool  # kvwatch's hybrid cache (else the full-attention one)
    sglang: Callable[[list[tuple[int, ...]], int], Side]  # SGLang's side: trace, pool pages
    same_hits: bool  # both trees match the same history tokens
    same_resume: bool  # and resume the same tokens


class Replay(NamedTuple):
    """Both sides' figures summed over the replays of one run."""

    kvwatch: dict[str, float]  # op -> seconds
    sglang: dict[str, float]
    hits: tuple[int, int]  # matched history tokens, kvwatch and SGLang, one replay
    resumed: tuple[int, int]  # tokens each resumed without computing, one replay

    def ratio(self, op: str) -> float:
        """SGLang's time over kvwatch's: above 1, kvwatch is faster."""
        return self.sglang[op] / self.kvwatch[op]


def tree_pages(prompts: list[tuple[int, ...]], page: int) -> int:
    """Pages a tree holds once every prompt is cached: its distinct page-aligned prefixes."""
    seen: set[int] = set()
    for prompt in prompts:
        chain = 0
        for end in range(page, len(prompt) + 1, page):
            chain = hash((chain, *prompt[end - page : end]))
            seen.add(chain)
    return len(seen)


def _one(pairing: Pairing, prompts: list, first: int, profile: Any) -> tuple[Side, Side]:
    pages = tree_pages(prompts, pairing.page) + max(len(p) for p in prompts) // pairing.page + SLACK
    kv = KvwatchSide(prompts, pairing.page, pages, hybrid=pairing.hybrid)
    kv.clock.profile = profile
    sg = pairing.sglang(prompts, pages)
    lists = [list(p) for p in prompts]
    for i, tokens in enumerate(lists):
        order = (kv, sg) if (i + first) % 2 else (sg, kv)
        for side in order:
            side.request(tokens)
    for side in (kv, sg) if first % 2 else (sg, kv):
        side.finish()
    return kv, sg


def replay(pairing: Pairing, prompts: list, repeats: int, profile: Any = None) -> Replay:
    """``repeats`` replays interleaved request by request; both sides checked after each."""
    out = Replay(dict.fromkeys(OPS, 0.0), dict.fromkeys(OPS, 0.0), (0, 0), (0, 0))
    for rep in range(repeats):
        gc.collect()
        gc.disable()
        try:
            kv, sg = _one(pairing, prompts, rep, profile)
        finally:
            gc.enable()
        if pairing.same_hits:
            assert kv.hits == sg.hits, f"the trees disagree: {kv.hits} hit tokens, SGLang {sg.hits}"
        if pairing.same_resume:
            assert kv.resumed == sg.resumed, f"resumed {kv.resumed}, SGLang {sg.resumed}"
        for op in OPS:
            out.kvwatch[op] += kv.spent[op]
            out.sglang[op] += sg.spent[op]
        out = out._replace(hits=(kv.hits, sg.hits), resumed=(kv.resumed, sg.resumed))
    return out
