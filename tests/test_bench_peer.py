"""Benchmark: kvwatch's prefix cache against SGLang's RadixCache, side by side in one process.

SGLang's ``radix_cache.py`` and the few modules it imports come from the
released wheel (``sglang==0.5.23``, fetched at run time into a temporary
folder, never kept); only what needs a GPU or a server is stubbed
(peer_sglang.py). Its allocator is a host stand-in at its cheapest: a free
stages one page id per page in a list (as its free groups do) where the
default path concatenates them onto the free list at every call. One seeded agentic trace (agentictrace.py: 8 agents, and a
10x trace of 40 agents with longer conversations) is replayed through both
trees, request by request, the side that goes first alternating every request
and every replay. Each op is timed in thread CPU time (``time.thread_time``):

match + lock
    kvwatch: ``match(handle)`` through the protocol (``build_cache`` with a
    radix config, 16-token pages): walk the tree, lock the path, trim it back
    to the deepest complete snapshot, give the holder its working pages and
    restore that snapshot into them, list the borrowed prefix's pages.
    SGLang: ``match_prefix`` on the prompt minus its last token (as its
    scheduler limits it) + ``lock(last_node)`` + ``path_device_indices``.
insert
    kvwatch: ``commit_chunk(handle, terminal=True)``: insert the computed
    pages, adopt nodes the tree already has (the holder's duplicate pages
    freed with their ownership checked), attach the captured snapshots,
    release superseded ones, move the lock down.
    SGLang: ``_insert_cache`` (the start of ``checkpoint``): read the
    request's row, insert, free the duplicate pages through the allocator's
    ``free_segment``. Its re-match, row rewrite and lock move are not counted.
evict-all
    kvwatch: ``flush()`` (evict every node, prune every snapshot); SGLang:
    ``evict`` of every token. Once per replay, after every request released.

Untimed on both sides: building the trees, opening a request, computing its
new tokens (allocate pages; kvwatch also advances with the snapshots its
capture points ask for), and releasing it. Both trees must report the same
hit tokens, and each must be empty with every page free after evict-all.
The figures are SGLang's time / kvwatch's, summed over the replays (above 1:
kvwatch is faster). One more replay of the large trace runs kvwatch's timed
ops under cProfile for the top entries. Runs only under ``-m bench``.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
from pathlib import Path

import pytest
from agentictrace import agentic_trace
from peer_replay import OPS, replay
from peer_sglang import VERSION, Unavailable, fetch, load

TRACES = {"small": (8, (6, 10)), "large": (40, (9, 15))}
REPEATS = {
    "small": int(os.environ.get("KVWATCH_BENCH_PEER_SMALL", "12")),
    "large": int(os.environ.get("KVWATCH_BENCH_PEER_LARGE", "6")),
}
PROFILE_LINES = 12
ROOT = str(Path(__file__).resolve().parents[1]) + "/"  # profile rows name files from here


@pytest.fixture(scope="module")
def sglang(request, tmp_path_factory):
    if "bench" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("the SGLang peer benchmark runs only under -m bench (it downloads a wheel)")
    try:
        return load(fetch(tmp_path_factory.mktemp("sglang")))
    except (Unavailable, OSError) as exc:
        pytest.skip(f"SGLang {VERSION} could not be fetched from the package index: {exc}")


def top_entries(profile: cProfile.Profile) -> list[str]:
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(PROFILE_LINES)
    rows = out.getvalue().splitlines()
    start = next(i for i, r in enumerate(rows) if r.lstrip().startswith("ncalls"))
    rows = [r.rstrip().replace(ROOT, "") for r in rows[start : start + PROFILE_LINES + 1]]
    return [r for r in rows if r]


@pytest.mark.bench
@pytest.mark.parametrize("size", ["small", "large"])
def test_prefix_cache_ops_against_sglang(benchmark, sglang, size):
    trace = agentic_trace(*TRACES[size])
    prompts = trace.prompts
    runs = []
    benchmark.pedantic(lambda: runs.append(replay(sglang, prompts, REPEATS[size])), rounds=1)
    totals = runs[0]
    info = {"trace": size, "requests": len(prompts), "prompt_tokens": trace.total_tokens()}
    info.update(hit_tokens=totals.hit_tokens, replays=REPEATS[size])
    for op in OPS:
        info[f"{op}_kvwatch_s"] = round(totals.kvwatch[op], 4)
        info[f"{op}_sglang_s"] = round(totals.sglang[op], 4)
        info[f"{op}_ratio"] = round(totals.sglang[op] / totals.kvwatch[op], 3)
    if size == "large":
        profile = cProfile.Profile()
        replay(sglang, prompts, 1, profile)
        info["profile"] = top_entries(profile)
    benchmark.extra_info.update(info)
