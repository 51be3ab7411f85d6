"""``make vllm-hunt`` without vLLM (``hunts/vllm.py``, ``driver_runs.py``): the matrix of runs,
each run's plan, and the report's tables, which keep the hand-written part of ``OUT.md``."""

from __future__ import annotations

import json
from pathlib import Path

from hunts import driver_runs, driver_tables, report
from hunts import vllm as hunt


def test_the_hunt_runs_mixed_in_every_layout_option_and_seed_and_the_rest_once():
    cases = hunt.matrix(["9.1.0"], seeds=2)
    assert len({c.name for c in cases}) == len(cases)
    mixed = [c for c in cases if c.profile == "mixed"]
    assert len(mixed) == len(hunt.LAYOUTS) * len(hunt.SCHEDS) * 2
    fixed = [c for c in cases if c.profile in hunt.FIXED]
    assert len(fixed) == len(hunt.LAYOUTS) * 3 and all(c.sched is None for c in fixed)
    own = {c.profile for c in cases if c.layout is None}
    assert own == {"mid-block-prefix", "hybrid-swa", "hybrid-mamba", "kv-events"}
    async_case = next(c for c in mixed if c.sched == "priority-async")
    plan = driver_runs.plan_for(async_case, Path("/x"), steps=7, turns=2, c=3)
    assert plan["layout"] == async_case.layout.to_json() and plan["sched"]["in_flight"] == 2
    assert (plan["steps"], plan["turns"], plan["concurrency"]) == (7, 2, 3)


def row(release="9.1.0", layout="full/b16/events", rules=None, **extra) -> dict:
    coverage = {"steps": 10, "requests": 4, "partial entries (most)": 3}
    coverage["events"] = {"keys stored": 5, "keys removed": 2, "AllBlocksCleared": 1}
    base = {
        "release": release,
        "profile": "mixed",
        "layout": layout,
        "sched": "fcfs",
        "seed": 0,
        "coverage": coverage,
        "rules": rules or {},
        "first": {r: f"{r} detail" for r in rules or {}},
        "unsupported": None,
        "error": None,
        "wall_s": 1.0,
    }
    return {**base, **extra}


def test_the_hunt_report_tables_coverage_and_findings_and_keeps_the_hand_written_part(tmp_path):
    rows = [row(), row(rules={"event-unannounced": 2}), row(unsupported="no unit here")]
    settings = {"releases": ["9.1.0"], "seeds": 1, "steps": 5, "turns": 2, "c": 2}
    settings |= {"jobs": 2, "cores": 2, "wall_s": 9}
    out = tmp_path / "hunt"
    report.write(out, settings, rows, driver_tables.markdown(rows, settings))
    text = (tmp_path / "hunt.md").read_text()
    assert "| 9.1.0 | `full/b16/events` | 2 | 20 | 8 |" in text
    assert "| 10/4/2 | 1 |" in text  # events stored/removed/cleared, runs with findings
    assert "| `event-unannounced` | 9.1.0 | `full/b16/events` | mixed | 1 | 2 |" in text
    assert "not run: 9.1.0 mixed `full/b16/events`: no unit here" in text
    md = tmp_path / "hunt.md"
    md.write_text(md.read_text() + "\n## Upstream\n\nsearched by hand\n")
    report.write(out, settings, rows[:1], driver_tables.markdown(rows[:1], settings))
    assert md.read_text().endswith("\n## Upstream\n\nsearched by hand\n")
    assert len(json.loads((tmp_path / "hunt.json").read_text())["runs"]) == 1
