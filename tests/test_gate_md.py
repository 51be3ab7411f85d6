"""The gate's section of BENCHMARKS.md: rendered from the benchmark's JSON, each
tier's median with every round, its phases, and replaced in place."""

from __future__ import annotations

import json

import gate_md
from md_section import replace_section


def bench(tier: str, walls: list[float], runs: int) -> dict:
    rounds = [{**one_round(wall, runs), "seed": k + 1} for k, wall in enumerate(walls)]
    info = {"tier": tier, "flags": "--quick" if tier == "quick" else "", "cores": 2,
            "wall_s": sorted(walls)[len(walls) // 2], "walls": sorted(walls), "rounds": rounds}  # fmt: skip
    return {"name": f"test_gate_wall_time[{tier}]", "extra_info": info}


def one_round(wall: float, runs: int) -> dict:
    return {
        "wall_s": wall,
        "gate_s": wall - 5,
        "runs": runs,
        "sum": {"run_s": 400.0, "server_start_s": 10.0, "turns_s": 200.0, "replay_s": 40.0,
                "settle_s": 30.0, "barrier_s": 50.0,
                "steps": 9000, "step_s": 120.0, "watch_s": 60.0, "calls_s": 30.0},
        "profiles": {"edges": 90.0, "chaos": 50.0},
        "runs_time": [{"profile": "edges", "c": 8, "run_s": 60.0, "turns_s": 40.0,
                       "settle_s": 5.0, "barrier_s": 10.0, "drain_s": 4.0, "replay_s": 6.0,
                       "step_s": 20.0}],
    }  # fmt: skip


DATA = {
    "datetime": "2026-11-26T06:00:00",
    "machine_info": {"cpu": {"brand_raw": "AMD EPYC", "count": 2}, "python_version": "3.11.7"},
    "benchmarks": [bench("default", [290.0, 310.0, 280.0], 32), bench("quick", [70.0], 8)],
}


def test_each_tier_shows_its_median_every_round_and_whether_it_met_its_target():
    text = "\n".join(gate_md.section(DATA))
    assert (
        "| default | `kvwatch gate` | 32 | 4 min 50 s | 290.0 s (seed 1), 310.0 s (seed 2), 280.0 s (seed 3) | 5 min 00 s | yes |"
        in text
    )
    assert (
        "| quick | `kvwatch gate --quick` | 8 | 1 min 10 s | 70.0 s (seed 1) | 1 min 30 s | yes |"
        in text
    )
    # the phases are shares of the lanes' time and ratios to the engine's compute: the
    # turns' 200 s less their barriers' 30 + 50 s is load
    assert "| load: the turns' requests, served | 120.0 | 29% | 1.00 |" in text
    assert (
        "| barriers: probes, audits, flushes, heap samples at the idle engine | 50.0 | 12% | 0.42 |"
        in text
    )
    assert "| **lanes, end to end** | **410.0** | 100% | **3.42** |" in text
    assert "120.0 s in engine steps (the engine's own compute), 60.0 s in the probe" in text
    # and each run's: 40 - 5 - 10 = 25 s of load, 60 s over 20 s of compute
    assert "| edges | 8 | 60.0 | 25.0 | 5.0 | 10.0 | 4.0 | 6.0 | 20.0 | 3.00 |" in text


def test_a_tier_over_its_target_says_no():
    slow = {**DATA, "benchmarks": [bench("default", [400.0], 32)]}
    assert "| 5 min 00 s | NO |" in "\n".join(gate_md.section(slow))


def test_the_section_is_replaced_in_place(tmp_path):
    doc = "# Benchmarks\n\n## The gate's time\n\nold\n\n## Engine\n\nkept\n"
    new = replace_section(doc, gate_md.HEADING, gate_md.section(DATA))
    assert new.startswith("# Benchmarks\n\n## The gate's time\n") and "old" not in new
    assert new.endswith("## Engine\n\nkept\n")
    path = tmp_path / "gate.json"
    path.write_text(json.dumps(DATA))
    md = tmp_path / "BENCHMARKS.md"
    md.write_text("# Benchmarks\n")
    assert gate_md.main([str(path), str(md)]) == 0
    assert gate_md.HEADING in md.read_text()
