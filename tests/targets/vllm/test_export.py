"""``kvwatch histories --replay FILE --export OUT.py``: a saved vLLM history as a script that
imports vLLM, torch and the standard library only, its operations as saved. Running the
script needs vLLM (``tests/histories/test_vllm_histories.py`` runs it)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import types

import pytest

from kvwatch.histories.ops import OPEN, SUBMIT, TURN, History, Op
from kvwatch.targets.vllm.export import script
from kvwatch.targets.vllm.histories import SETUPS

STDLIB = set(sys.stdlib_module_names)


def saved(setup: str = "streaming", engine: str = "vllm") -> dict:
    ops = (
        Op(turn=0, at=0, kind=OPEN, session="s0"),
        Op(turn=0, at=0, kind=TURN, rid="s0-t0", session="s0", tokens=(40, 41, 42), max_new=2),
        Op(turn=0, at=1, kind=SUBMIT, rid="r1", tokens=tuple(range(50, 70)), max_new=3),
    )
    history = History(engine=engine, seed=4, ops=ops)
    return {
        "format": 1,
        "target": {"engine": engine, "version": "0.33.0", "setup": setup},
        "seed": 4,
        "failed": ["audit"],
        "findings": [],
        "history": history.to_json(),
    }


def test_the_script_imports_only_vllm_torch_and_the_standard_library():
    tree = ast.parse(script(saved(), "h.json"))
    roots = {
        (node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert roots - STDLIB == {"vllm", "torch"}, roots
    assert "__future__" in roots


def test_the_script_carries_the_history_and_setup_as_saved():
    module = types.ModuleType("replay")
    exec(compile(script(saved(), "h.json"), "replay.py", "exec"), module.__dict__)
    history = module.HISTORY
    assert history["vllm"] == "0.33.0" and history["setup"] == SETUPS["streaming"].to_json()
    assert [op["rid"] for op in history["ops"]] == ["", "s0-t0", "r1"]
    assert history["ops"][2]["tokens"] == list(range(50, 70))
    assert "h.json, failed audit" in history["source"]


@pytest.mark.parametrize(
    "data,words",
    [
        (saved(engine="sglang"), "replays vLLM histories"),
        (saved(setup="mamba-align"), "builds one full-attention group"),
        (saved(setup="nope"), "no vLLM setup 'nope'"),
        ({"format": 9}, "not a saved history"),
    ],
)
def test_what_it_cannot_export_is_a_value_error(data, words):
    with pytest.raises(ValueError, match=words):
        script(data, "h.json")


def test_the_command_writes_the_script_and_wants_a_file(tmp_path):
    path = tmp_path / "h.json"
    path.write_text(json.dumps(saved()))
    cmd = [sys.executable, "-m", "kvwatch", "histories"]
    done = subprocess.run(
        [*cmd, "--replay", str(path), "--export", str(tmp_path / "r.py")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "r.py").read_text().startswith('"""A kvwatch history replayed')
    alone = subprocess.run(
        [*cmd, "--export", str(tmp_path / "r.py")], capture_output=True, text=True, timeout=120
    )
    assert alone.returncode == 2 and "--export goes with --replay" in alone.stderr
