"""The flags that pick ``--engine lightllm-cache``, and their usage errors (exit 2), without LightLLM.

A folder with LightLLM's file layout (empty files) stands in for a checkout:
the flags only look at files, never run LightLLM's code.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvwatch.cli import main
from kvwatch.targets.lightllm.checkout_check import LINEAR, NEEDED, find_checkout
from kvwatch.targets.lightllm.target import LightllmCacheTarget
from kvwatch.targets.select import TargetFlags, choose


def layout(root: Path, *, linear: bool = True) -> Path:
    for path in (*NEEDED, LINEAR) if linear else NEEDED:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("")
    return root


def test_the_flags_pick_it(tmp_path):
    src = layout(tmp_path / "LightLLM")
    target = choose(
        TargetFlags(engine="lightllm-cache", lightllm_src=str(src), lightllm_cache="linear"),
        tmp_path,
    )
    assert isinstance(target, LightllmCacheTarget)
    assert (target.cache, target.checkout.path, target.checkout.linear) == ("linear", src, True)
    assert target.checkout.commit is None  # not a git work tree
    default = choose(TargetFlags(engine="lightllm-cache", lightllm_src=str(src)), tmp_path)
    assert default.cache == "radix"


@pytest.mark.parametrize(
    "flags, message",
    [
        (dict(engine="lightllm-cache"), "needs --lightllm-src DIR"),
        (dict(engine="lightllm-cache", lightllm_src="MISSING"), "no such folder"),
        (dict(engine="lightllm-cache", lightllm_src="EMPTY"), "is not a LightLLM source checkout"),
        (
            dict(engine="lightllm-cache", lightllm_src="PLAIN", lightllm_cache="linear"),
            "has no lightllm/server/router/dynamic_prompt/linear_att_radix_cache.py",
        ),
        (dict(engine="lightllm-cache", lightllm_src="FULL", faults=("x",)), "no --inject"),
        (dict(lightllm_src="FULL"), "--lightllm-src goes with --engine lightllm-cache only"),
        (
            dict(engine="sglang-cache", sglang_version="0.5.23", lightllm_cache="linear"),
            "--lightllm-cache goes with --engine lightllm-cache only",
        ),
        (
            dict(engine="lightllm-cache", lightllm_src="FULL", page_size=4),
            "--page-size goes with --engine sglang-cache",
        ),
    ],
)
def test_flags_that_do_not_fit_are_usage_errors(tmp_path, flags, message):
    folders = {
        "MISSING": tmp_path / "missing",
        "EMPTY": tmp_path,
        "PLAIN": layout(tmp_path / "plain", linear=False),
        "FULL": layout(tmp_path / "full"),
    }
    if "lightllm_src" in flags:
        flags["lightllm_src"] = str(folders[flags["lightllm_src"]])
    with pytest.raises(ValueError, match=message):
        choose(TargetFlags(**flags), tmp_path)


def test_the_command_line_says_what_is_wrong_and_exits_2(tmp_path, capsys):
    args = ["gate", "--engine", "lightllm-cache", "--out", str(tmp_path / "out")]
    assert main(args) == 2
    assert "--engine lightllm-cache needs --lightllm-src DIR" in capsys.readouterr().err
    assert main([*args, "--lightllm-src", str(tmp_path)]) == 2
    assert "is not a LightLLM source checkout" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # argparse: not one of the caches
        main([*args, "--lightllm-src", str(tmp_path), "--lightllm-cache", "mamba"])
    assert exc.value.code == 2
    assert main([*args, "--lightllm-src", str(layout(tmp_path / "x")), "--profile", "no"]) == 2
    assert "unknown profile 'no'" in capsys.readouterr().err


def test_a_checkout_with_the_linear_cache_is_found(tmp_path):
    src = layout(tmp_path)
    found = find_checkout(src, "linear")
    assert found.linear and found.describe() == f"LightLLM {src.resolve()}"
