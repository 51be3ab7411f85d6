"""BENCHMARKS.md from pytest-benchmark JSON: every target shown, met or not."""

from __future__ import annotations

from benchmarks_md import render


def bench(name: str, mean: float, **info) -> dict:
    return {"name": name, "stats": {"mean": mean, "median": mean * 0.9}, "extra_info": info}


def test_each_target_is_judged_from_the_json():
    data = {
        "datetime": "2026-11-21T10:00:00",
        "machine_info": {"python_version": "3.11.7", "cpu": {"count": 2, "brand_raw": "x86"}},
        "benchmarks": [
            bench("test_instrumentation_overhead", 10.0, overhead_pct=1.2),
            bench("test_audit_cost[1000000]", 0.25, pages=1000000, nodes=9000),
            bench("test_prefill_computed_against_unique_tokens[8]", 5.0, page=8, ratio=1.05),
            bench("test_prefill_computed_against_unique_tokens[16]", 5.0, page=16, ratio=1.15),
            bench("test_continuous_batching_c8_against_c1", 2.0, ratio=2.1),
        ],
    }
    text = render(data)
    assert "| instrumentation overhead | 1.2 % | <= 3 % | yes |" in text
    assert "| full audit of a 1M-page pool | 250.0 ms | <= 100 ms | NO |" in text
    assert "| prefill computed / unique tokens, 16-token pages | 1.15 | <= 1.1 | NO |" in text
    assert "| prefill computed / unique tokens, 8-token pages | 1.05 | <= 1.1 | yes |" in text
    assert text.index("16-token pages |") < text.index("8-token pages |")
    assert "| tokens/s at c = 8 / c = 1 | 2.1x | >= 3 | NO |" in text
    assert "| test_audit_cost[1000000] | 1000000 | 9000 | 250.00 ms | 225.00 ms |" in text


def test_a_missing_benchmark_is_reported_as_not_measured():
    text = render({"benchmarks": []})
    assert text.count("not measured") == 4  # the peer figures have a section of their own


def test_the_sglang_peer_ratios_have_their_section_and_a_pointer():
    info = dict(pairing="full", peer="RadixCache 0.5.23", page=16, trace="small", requests=137)
    info.update(prompt_tokens=612231, runs=5, replays=4, hits=[9, 9], resumed=[9, 9])
    for op, ratio in (("match", 1.25), ("insert", 0.64), ("evict", 1.0)):
        spread = [ratio, ratio - 0.1, ratio + 0.1]
        info.update({f"{op}_ratio": spread, f"{op}_kvwatch_s": 1.0, f"{op}_sglang_s": ratio})
    text = render(
        {"benchmarks": [bench("test_prefix_cache_ops_against_sglang[full-small]", 1, **info)]}
    )
    assert "Against SGLang's prefix caches: see the section below" in text
    assert "| small | insert | 1.0 s | 0.64 s | **0.640x** (0.540 - 0.740) | NO |" in text
    assert "| small | match + lock | 1.0 s | 1.25 s | **1.250x** (1.150 - 1.350) | yes |" in text
    assert text.index("## Against SGLang's prefix caches") < text.index("## Engine")
