"""kvwatch as a user installs it: the wheel in a fresh venv, run from the checkout's root.

The checkout's root is where a user's CI runs it, and where ``python -m`` and
Locust put the working directory first on ``sys.path``. Nothing there may
shadow the installed package: the gate started from the root must import the
wheel's modules (in its server and its Locust process too) and pass, and the
pytest plugin the wheel registers must load and judge. Every module must also
lie where its name says (``kvwatch.a.b`` at ``kvwatch/a/b.py``), in the wheel
and in the checkout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from paths import PACKAGE, REPO

pytestmark = pytest.mark.e2e
INSTALL_TIMEOUT_S = 900
QUICK_GATE = ("gate", "--quick", "--profile", "bad-input", "--no-report")
PIP_WHEEL = (sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q")

# every module's file against its dotted name, printed as JSON by the Python it runs in
WHERE = """
import importlib.util, json, pkgutil, kvwatch
wrong, count = [], 0
for m in pkgutil.walk_packages(kvwatch.__path__, "kvwatch."):
    origin = importlib.util.find_spec(m.name).origin
    want = m.name.replace(".", "/") + ("/__init__.py" if m.ispkg else ".py")
    count += 1
    if not origin.endswith(want):
        wrong.append(f"{m.name}: {origin}")
print(json.dumps({"root": kvwatch.__file__, "count": count, "wrong": wrong}))
"""

# the top-level names the installed distribution put in site-packages
TOP_LEVEL = """
import importlib.metadata, json
files = importlib.metadata.files("kvwatch")
print(json.dumps(sorted({f.parts[0] for f in files if f.parts[0] != ".."})))
"""

PLUGIN_TEST = """
import pytest

from kvwatch.engine import Engine, EngineConfig, SamplingParams

def run_turns(faults, leak_gate):
    engine = Engine(EngineConfig(faults=faults))
    with leak_gate(engine.probe, warmup=1) as gate:
        for turn in range(4):
            engine.generate([[40 + turn] * 20], SamplingParams(max_tokens=2))
            gate.turn()

def test_clean(leak_gate):
    run_turns(frozenset(), leak_gate)

def test_leaky(leak_gate):
    run_turns(frozenset({"root-ref-leak-on-miss"}), leak_gate)

@pytest.fixture
def engine():
    return Engine(EngineConfig())

@pytest.mark.leak_gate(probe="engine", warmup=1)
def test_marked(engine, leak_gate_turn):
    for turn in range(4):
        engine.generate([[50 + turn] * 20], SamplingParams(max_tokens=2))
        leak_gate_turn()
"""


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, **kw)


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh venv with kvwatch installed from the wheel built from this checkout."""
    where = tmp_path_factory.mktemp("wheel")
    built = run(
        [*PIP_WHEEL, "-w", str(where), str(REPO)],
        timeout=INSTALL_TIMEOUT_S,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = where.glob("kvwatch-*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(where / "venv")], check=True)
    python = where / "venv" / "bin" / "python"
    installed = run(
        [str(python), "-m", "pip", "install", "-q", str(wheel), "pytest"],
        timeout=INSTALL_TIMEOUT_S,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    return where / "venv"


def test_every_module_lies_where_its_name_says_in_the_checkout():
    out = json.loads(run([sys.executable, "-c", WHERE]).stdout)
    assert out["wrong"] == [] and out["count"] > 150
    assert Path(out["root"]).parent == PACKAGE


def test_the_wheel_holds_neither_mutation_nor_hunts_and_each_module_lies_where_named(venv):
    python = str(venv / "bin" / "python")
    out = json.loads(run([python, "-c", WHERE]).stdout)
    assert out["wrong"] == [] and out["count"] > 150
    assert Path(out["root"]).is_relative_to(venv), out["root"]  # the wheel's, not the checkout's
    top = json.loads(run([python, "-c", TOP_LEVEL]).stdout)  # no mutation/, no hunts/
    assert [name for name in top if not name.endswith(".dist-info")] == ["kvwatch"], top


def test_the_quick_gate_passes_from_the_checkouts_root(venv, tmp_path):
    """Its server and Locust run from the root too (``python -m``, ``locust -f``)."""
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    gate = run(
        [str(venv / "bin" / "kvwatch"), *QUICK_GATE, "--out", str(tmp_path / "out")],
        env=env,
        timeout=INSTALL_TIMEOUT_S,
    )
    assert gate.returncode == 0, gate.stdout[-2000:] + gate.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["verdict"] == "pass" and [r["profile"] for r in summary["runs"]] == ["bad-input"]
    assert summary["runs"][0]["requests"] > 0


def test_the_pytest_plugin_judges_from_the_checkouts_root(venv, tmp_path):
    """The plugin the wheel registers (``pytest11``) fails the leaky test, passes the clean
    one and the marked one, and lists the marked one in its summary."""
    (tmp_path / "test_turns.py").write_text(PLUGIN_TEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not the checkout's pyproject.toml
    config = ["-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path), str(tmp_path)]
    result = run(
        [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", *config],
        timeout=INSTALL_TIMEOUT_S,
    )
    assert "1 failed, 2 passed" in result.stdout, result.stdout[-3000:] + result.stderr[-2000:]
    assert "kvwatch leak gate" in result.stdout and "test_marked" in result.stdout
    assert "kvwatch detector 'refcount' failed" in result.stdout
