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
    assert text.count("not measured") == 4
