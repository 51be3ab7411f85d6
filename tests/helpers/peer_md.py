"""The peer section of BENCHMARKS.md, from pytest-benchmark's JSON of tests/targets/test_bench_peer.py.

``benchmarks_md.py`` renders it inside the whole file (``make bench``);
``make bench-peer`` reruns only the peer benchmark and puts a fresh section
in place of the old one::

    python tests/helpers/peer_md.py PEER.json BENCHMARKS.md [RERUN.json]

With a second run of the same benchmark (``RERUN.json``), the section adds
whether each published median lands inside that run's min - max range:
"yes", "close" (outside by at most ``CLOSE`` of the median) or "NO" (it did
not reproduce), and the cells whose >= 1.0 verdict the rerun turned.

Invariants: the section starts at ``HEADING`` and ends before the next
``## `` heading (or the end of the file), so replacing it leaves every other
line as it was; every ratio shown is a median over the runs, with its min
and max, and the section says when, on what and how it was measured.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import md_section
from md_section import measured

HEADING = "## Against SGLang's prefix caches"
PEER = "test_prefix_cache_ops_against_sglang"
OPS = {"match": "match + lock", "insert": "insert", "evict": "evict-all"}
PAIRINGS = ("full", "mamba", "swa")
CLOSE = 0.05  # a median this far outside the other run's range (relative) is "close"
COMMAND = "make bench-peer"
POINTER = (
    "Against SGLang's prefix caches: see the section below "
    "(every ratio the median of 5 runs, with its min and max)."
)
TIMED = [
    "kvwatch's side: `full` is its tree for a full-attention model (`FullAttentionPrefixCache`); "
    "`mamba` and `swa` its hybrid cache (window, linear state), snapshots captured where the "
    "scheduler asks for them. SGLang's: its released caches, unmodified, with their own pools "
    "and allocators (`RadixCache`: a host-side paged allocator at its cheapest). Both pools "
    "hold the pages the trace's tree needs plus the same slack. Timed:",
    "",
    "- match + lock: kvwatch `match` (walk, lock the path, trim to the deepest complete "
    "snapshot, working pages and the snapshot restored into them, the prefix's pages); SGLang "
    "`match_prefix` of the prompt minus its last token (mamba: the state copied into a slot it "
    "allocates) + `inc_lock_ref`/`lock` + the prefix's indices.",
    "- insert: kvwatch `commit_chunk` + `release(commit=True)` (insert, adopt and free "
    "duplicates, attach snapshots, release superseded ones, unlock, free the rest); SGLang "
    "`cache_finished_req` (insert, free duplicates and the unaligned page, state to the tree or "
    "freed, unlock), for `RadixCache` `_insert_cache` + the unaligned page freed + `unlock`.",
    "- evict-all: kvwatch `flush`; SGLang `evict` of everything (hybrid allocators inside one "
    "free group), once per replay after every request finished.",
]


def _runs(data: dict) -> list[dict]:
    infos = [b["extra_info"] for b in data["benchmarks"] if b["name"].startswith(PEER)]
    order = {
        (p, s): i for i, (p, s) in enumerate((p, s) for p in PAIRINGS for s in ("small", "large"))
    }
    return sorted(infos, key=lambda i: order.get((i["pairing"], i["trace"]), 99))


def _ratio(spread: list[float]) -> str:
    median, low, high = spread
    return f"**{median:.3f}x** ({low:.3f} - {high:.3f})"


def _table(runs: list[dict]) -> list[str]:
    lines = [
        "| pairing | SGLang | page | trace | op | kvwatch | SGLang | SGLang / kvwatch, median (min - max) | >= 1.0 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i in runs:
        for op, what in OPS.items():
            spread = i[f"{op}_ratio"]
            lines.append(
                f"| {i['pairing']} | {i['peer']} | {i['page']} | {i['trace']} | {what} "
                f"| {i[f'{op}_kvwatch_s']} s | {i[f'{op}_sglang_s']} s | {_ratio(spread)} "
                f"| {'yes' if spread[0] >= 1.0 else 'NO'} |"
            )
    return lines


def _hits(runs: list[dict]) -> list[str]:
    lines = [
        "| pairing | trace | requests | prompt tokens | runs x replays | hit: kvwatch / SGLang | resumed: kvwatch / SGLang |",
        "|---|---|---|---|---|---|---|",
    ]
    for i in runs:
        (hk, hs), (rk, rs) = i["hits"], i["resumed"]
        lines.append(
            f"| {i['pairing']} | {i['trace']} | {i['requests']} | {i['prompt_tokens']} "
            f"| {i['runs']} x {i['replays']} | {hk} / {hs} | {rk} / {rs} |"
        )
    return lines


def _agree(published: list[float], other: list[float]) -> str:
    """Whether the published median lies in the other run's min - max: yes, close or NO."""
    median, (_, low, high) = published[0], other
    off = max(low - median, median - high, 0.0) / median
    return "yes" if off == 0 else "close" if off <= CLOSE else "NO"


def _verdicts(runs: list[dict], again: dict) -> str:
    """Which cells' >= 1.0 verdict the rerun turned, if any."""
    turned = [
        f"{i['pairing']} {i['trace']} {what}"
        for i in runs
        if (j := again.get((i["pairing"], i["trace"])))
        for op, what in OPS.items()
        if (i[f"{op}_ratio"][0] >= 1.0) != (j[f"{op}_ratio"][0] >= 1.0)
    ]
    return f"differs in the rerun for {', '.join(turned)}" if turned else "is the same in both runs"


def _rerun(runs: list[dict], other: dict) -> list[str]:
    again = {(i["pairing"], i["trace"]): i for i in _runs(other)}
    lines = [
        f"Rerun: the same benchmark again, measured {other.get('datetime', '')[:19]} UTC on the "
        f"same machine. Each cell: whether the published median lies in the rerun's min - max "
        f"(close: outside it by at most {CLOSE:.0%} of the median; NO: the figure did not "
        f"reproduce). The >= 1.0 column {_verdicts(runs, again)}.",
        "",
        "| pairing | trace | op | published | rerun | reproduced |",
        "|---|---|---|---|---|---|",
    ]
    for i in runs:
        j = again.get((i["pairing"], i["trace"]))
        for op, what in OPS.items() if j else ():
            mine, theirs = i[f"{op}_ratio"], j[f"{op}_ratio"]
            lines.append(
                f"| {i['pairing']} | {i['trace']} | {what} | {_ratio(mine)} | {_ratio(theirs)} "
                f"| {_agree(mine, theirs)} |"
            )
    return lines


def section(data: dict, *, shared: bool = True, rerun: dict | None = None) -> list[str]:
    runs = _runs(data)
    if not runs:
        return []
    lines = [
        HEADING,
        "",
        measured(data, COMMAND, quiet=not shared) + ".",
        "Both caches in one process, the same trace and page size, interleaved request by "
        "request; thread CPU time per op summed over a run's replays. Each ratio is the median "
        "of the runs, with the min and max (what each side times: tests/targets/test_bench_peer.py).",
        "",
        *TIMED,
        "",
        *_table(runs),
        "",
        *([*_rerun(runs, rerun), ""] if rerun else []),
        "What each tree matched (hit) and resumed without computing, per replay. `full`: both "
        "keep every page's history, and agree. `swa`: the same history; kvwatch resumes at its "
        "snapshots, SGLang wherever the window is cached. `mamba`: SGLang keeps a state only "
        "where a request ended and reports only the prefix it resumes; kvwatch's hit is the "
        "history it matched.",
        "",
        *_hits(runs),
    ]
    for i in runs:
        if i.get("profile"):
            lines += ["", f"kvwatch's timed ops on one large replay, pairing {i['pairing']} "
                      "(cProfile, by own time):", "", "```", *i["profile"], "```"]  # fmt: skip
    return lines


def replace_section(text: str, new: list[str]) -> str:
    """``text`` with its peer section replaced by ``new`` (appended if it has none)."""
    return md_section.replace_section(text, HEADING, new)


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4):
        print("usage: peer_md.py PEER.json BENCHMARKS.md [RERUN.json]", file=sys.stderr)
        return 2
    data = json.loads(Path(argv[1]).read_text())
    rerun = json.loads(Path(argv[3]).read_text()) if len(argv) == 4 else None
    path = Path(argv[2])
    quiet = os.environ.get("KVWATCH_BENCH_QUIET") == "1"  # nothing else ran: say so
    new = section(data, rerun=rerun, shared=not quiet)
    path.write_text(replace_section(path.read_text(), new))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
