"""Benchmark: kvwatch's prefix cache against SGLang's, side by side in one process.

Three pairings (peer_replay.py), each on one seeded agentic trace
(agentictrace.py: 8 agents, and a 10x trace of 40 agents with longer
conversations), the same pages on both sides:

========  ==========================================  ====================================  ====
pairing   kvwatch                                     SGLang                                page
========  ==========================================  ====================================  ====
full      ``FullAttentionPrefixCache`` (no state)     ``RadixCache`` 0.5.23                 16
mamba     the hybrid radix backend, engine captures   ``MambaRadixCache`` 0.5.11            1
swa       the hybrid radix backend, engine captures   ``SWARadixCache`` 0.5.11              16
========  ==========================================  ====================================  ====

SGLang's modules come from the released wheels, unmodified, fetched at run
time (peer_sglang.py for 0.5.23's ``RadixCache`` with a host-side paged
allocator at its cheapest; ``kvwatch.targets.sglang`` for 0.5.11's hybrid
caches with the release's own pools and allocators: peer_hybrid.py). What
each side times, in thread CPU time (``time.thread_time``):

match + lock
    kvwatch: ``match(handle)``: walk the tree, lock the path (the full cache
    splits the node the match ends in), trim back to the deepest complete
    snapshot (hybrid), give the holder its working pages (hybrid: a linear
    state page and the window's swa.kv pages) and restore the snapshot into
    them, list the borrowed prefix's pages. SGLang: ``match_prefix`` on the
    prompt minus its last token (its mamba cache copies the matched state
    into a state slot it allocates for the request) + the lock
    (``lock``/``inc_lock_ref``) + the prefix's page indices.
insert
    kvwatch: ``commit_chunk(handle)`` then ``release(handle, commit=True)``:
    insert the computed pages, adopt nodes the tree has (the holder's
    duplicate pages freed, ownership checked), attach the captured snapshots,
    release superseded ones, unlock, free the holder's remaining pages and
    working state. SGLang: ``cache_finished_req`` (hybrid: insert, free the
    duplicate and unaligned pages, hand the state slot to the tree or free
    it, unlock), or for ``RadixCache`` ``_insert_cache`` (insert, free
    duplicates) + free of the unaligned page + ``unlock``.
evict-all
    kvwatch: ``flush()`` (evict every node, prune every snapshot); SGLang:
    ``evict`` of every token (and state), once per replay, after every
    request finished; SGLang's hybrid allocators inside a free group.

Untimed on both sides: building the caches, opening a request, its row and
pages for its new tokens (kvwatch also advances with the snapshots its
capture points ask for, as the scheduler does). Each side must be empty
with every page free after evict-all; hit tokens must agree where the
semantics do (peer_replay.py). A run is ``REPEATS`` replays; every figure is
the median over ``RUNS`` runs of SGLang's time / kvwatch's (above 1: kvwatch
is faster), with the min and max. One more replay of the large trace runs
kvwatch's timed ops under cProfile for the top entries. Runs only under
``-m bench``.
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import os
import pstats

import pytest
from agentictrace import agentic_trace
from paths import REPO
from peer_hybrid import HYBRID_VERSION, HybridSide
from peer_replay import Pairing, replay
from peer_sglang import VERSION, RadixSide, Unavailable, fetch, load
from peer_timing import OPS, Spread

from kvwatch.targets.sglang import wheel_fetch
from kvwatch.targets.sglang.release_import import load as load_release

TRACES = {"small": (8, (6, 10)), "large": (40, (9, 15))}
RUNS = int(os.environ.get("KVWATCH_BENCH_PEER_RUNS", "5"))
REPEATS = {
    "small": int(os.environ.get("KVWATCH_BENCH_PEER_SMALL", "6")),
    "large": int(os.environ.get("KVWATCH_BENCH_PEER_LARGE", "2")),
}
PROFILE_LINES = 10
ROOT = str(REPO) + "/"  # profile rows name files from here


@pytest.fixture(scope="module")
def pairings(request, tmp_path_factory) -> dict[str, tuple[Pairing, object]]:
    """Each pairing with the context its SGLang side runs in."""
    if "bench" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("the SGLang peer benchmark runs only under -m bench (it downloads wheels)")
    try:
        radix = load(fetch(tmp_path_factory.mktemp("sglang")))
        hybrid = load_release(HYBRID_VERSION)
    except (Unavailable, wheel_fetch.Unavailable, OSError) as exc:
        pytest.skip(f"SGLang {VERSION} or {HYBRID_VERSION} could not be fetched: {exc}")
    return {
        "full": (
            Pairing("full", f"RadixCache {VERSION}", 16, False,
                    lambda p, n: RadixSide(radix, p, 16, n), True, True),
            contextlib.nullcontext,
        ),
        "mamba": (
            Pairing("mamba", f"MambaRadixCache {HYBRID_VERSION}", 1, True,
                    lambda p, n: HybridSide(hybrid, p, "mamba", n), False, False),
            hybrid.active,
        ),
        "swa": (
            Pairing("swa", f"SWARadixCache {HYBRID_VERSION}", 16, True,
                    lambda p, n: HybridSide(hybrid, p, "swa", n), True, False),
            hybrid.active,
        ),
    }  # fmt: skip


def top_entries(profile: cProfile.Profile) -> list[str]:
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(PROFILE_LINES)
    rows = out.getvalue().splitlines()
    start = next(i for i, r in enumerate(rows) if r.lstrip().startswith("ncalls"))
    rows = [r.rstrip().replace(ROOT, "") for r in rows[start : start + PROFILE_LINES + 1]]
    return [r for r in rows if r]


@pytest.mark.bench
@pytest.mark.parametrize("size", ["small", "large"])
@pytest.mark.parametrize("name", ["full", "mamba", "swa"])
def test_prefix_cache_ops_against_sglang(benchmark, pairings, name, size):
    pairing, context = pairings[name]
    trace = agentic_trace(*TRACES[size])
    prompts = trace.prompts
    runs = []
    with context():
        benchmark.pedantic(
            lambda: runs.extend(replay(pairing, prompts, REPEATS[size]) for _ in range(RUNS)),
            rounds=1,
        )
        profile = cProfile.Profile()
        if size == "large":
            replay(pairing, prompts, 1, profile)
    info = {"pairing": name, "peer": pairing.peer, "page": pairing.page, "trace": size}
    info.update(requests=len(prompts), prompt_tokens=trace.total_tokens())
    info.update(runs=RUNS, replays=REPEATS[size], hits=runs[0].hits, resumed=runs[0].resumed)
    for op in OPS:
        info[f"{op}_ratio"] = Spread.of([r.ratio(op) for r in runs]).rounded()
        info[f"{op}_kvwatch_s"] = round(Spread.of([r.kvwatch[op] for r in runs]).median, 4)
        info[f"{op}_sglang_s"] = round(Spread.of([r.sglang[op] for r in runs]).median, 4)
    if size == "large":
        info["profile"] = top_entries(profile)
    benchmark.extra_info.update(info)
