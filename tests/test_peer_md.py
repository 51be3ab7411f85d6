"""The peer section of BENCHMARKS.md: medians with their range, replaced in place."""

from __future__ import annotations

import pytest
from peer_md import HEADING, replace_section, section
from peer_timing import Spread


def test_a_spread_is_the_median_and_the_range():
    assert Spread.of([3.0, 1.0, 2.0, 5.0, 4.0]) == Spread(3.0, 1.0, 5.0)
    assert Spread.of([1.0, 2.0]).median == 1.5
    with pytest.raises(ValueError):
        Spread.of([])


def test_the_section_is_replaced_and_nothing_else():
    text = "# B\n\n## A\n\nold a\n\n" + HEADING + "\n\nold peer\n\n## C\n\nc\n"
    out = replace_section(text, [HEADING, "", "new peer"])
    assert out == "# B\n\n## A\n\nold a\n\n" + HEADING + "\n\nnew peer\n\n## C\n\nc\n"
    assert replace_section("# B\n", [HEADING]) == "# B\n\n" + HEADING + "\n"


def test_every_ratio_shows_its_median_min_and_max():
    info = {"pairing": "swa", "peer": "SWARadixCache 0.5.11", "page": 16, "trace": "small"}
    info.update(requests=3, prompt_tokens=30, runs=5, replays=2, hits=[9, 9], resumed=[8, 9])
    for op in ("match", "insert", "evict"):
        info.update({f"{op}_ratio": [1.2, 0.9, 1.5], f"{op}_kvwatch_s": 1, f"{op}_sglang_s": 1.2})
    data = {"datetime": "2026-11-24T10:00:00", "benchmarks": []}
    data["benchmarks"].append({"name": "test_prefix_cache_ops_against_sglang[swa-small]"})
    data["benchmarks"][0]["extra_info"] = info
    lines = section(data)
    assert lines[0] == HEADING and "2026-11-24T10:00:00 UTC" in lines[2]
    rows = [r for r in lines if r.startswith("| swa | SWARadixCache")]
    assert len(rows) == 3 and all("**1.200x** (0.900 - 1.500) | yes |" in r for r in rows)


def test_a_rerun_says_for_each_cell_whether_it_reproduced():
    def run(when: str, spread: list[float]) -> dict:
        info = {"pairing": "mamba", "peer": "MambaRadixCache 0.5.11", "page": 1}
        info.update(trace="large", requests=3, prompt_tokens=30, runs=5, replays=2)
        info.update(hits=[9, 9], resumed=[8, 9])
        for op, k in zip(("match", "insert", "evict"), (1.0, 1.2, 1.6), strict=True):
            info[f"{op}_ratio"] = [round(v * k, 3) for v in spread]
            info.update({f"{op}_kvwatch_s": 1, f"{op}_sglang_s": 1})
        name = "test_prefix_cache_ops_against_sglang[mamba-large]"
        return {"datetime": when, "benchmarks": [{"name": name, "extra_info": info}]}

    published = run("2026-11-24T10:00:00", [1.10, 1.00, 1.20])
    assert not any(r.startswith("| pairing | trace | op | published") for r in section(published))
    for other, verdict in (([1.3, 1.05, 1.4], "yes"), ([1.2, 1.14, 1.3], "close")):
        lines = section(published, rerun=run("2026-11-24T11:00:00", other))
        rows = [r for r in lines if r.startswith("| mamba | large |") and "x** (" in r]
        assert len(rows) == 3 and all(r.endswith(f"| {verdict} |") for r in rows), rows
        assert any("2026-11-24T11:00:00 UTC" in r and "same in both runs" in r for r in lines)
    lines = section(published, rerun=run("2026-11-24T11:00:00", [0.95, 0.9, 1.0]))
    assert any("differs in the rerun for mamba large match + lock." in r for r in lines)
    rows = [r for r in lines if r.startswith("| mamba | large |") and "x** (" in r]
    assert [r.rsplit("|", 2)[1].strip() for r in rows] == ["NO"] * 3
