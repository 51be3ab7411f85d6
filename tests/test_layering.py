"""Layering: the engine core publishes events and never imports telemetry, load or
dashboard code; the HTTP server only reaches telemetry through what it is handed."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

FORBIDDEN = ("opentelemetry", "locust", "grafana_client", "grafana_foundation_sdk", "gevent")
ROOT = Path(__file__).resolve().parents[1]


def test_importing_the_engine_pulls_no_telemetry():
    code = (
        "import sys, pkgutil, importlib, kvwatch.engine as e\n"
        "for m in pkgutil.walk_packages(e.__path__, 'kvwatch.engine.'):\n"
        "    importlib.import_module(m.name)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"kvwatch.engine imported {out.stdout.strip()}"


def imports_of(folder: str) -> dict[str, set[str]]:
    out = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
        out[str(path.relative_to(ROOT))] = names
    return out


def test_the_server_code_imports_no_telemetry_or_instrumentation():
    """FastAPI itself may load the OTel API; the server's own modules never use it."""
    for path, names in imports_of("server").items():
        bad = {
            n for n in names if n.split(".")[0] in FORBIDDEN or n.startswith("kvwatch.telemetry")
        }
        assert not bad, f"{path} imports {sorted(bad)}"


LISTENERS = ("metrics.py", "spans.py", "providers.py", "spanfile.py", "names.py", "__init__.py")
ENGINE_API = {
    "kvwatch.engine",
    "kvwatch.engine.events",
    "kvwatch.engine.probe",
    "kvwatch.engine.config",
    "kvwatch.engine.faults",
    "kvwatch.engine.overrides",
    "kvwatch.engine.request",
    "kvwatch.engine.model.tokenizer",
    "kvwatch.engine.cache.failpoints",  # the failpoint sites' names, for coverage
}


def test_telemetry_and_the_gate_only_listen_to_the_engine():
    """Telemetry reads events, stats and names; detectors read probe JSON only;
    the recorder and the replay drive the engine through its public API. Nothing
    here reaches into the cache, the scheduler or the model."""
    for path, names in {**imports_of("telemetry"), **imports_of("gate")}.items():
        engine = {n for n in names if n.startswith("kvwatch.engine")}
        if path.startswith("gate/detectors/"):
            assert not engine, f"{path} imports {sorted(engine)}: detectors read probe JSON"
        elif Path(path).name in LISTENERS and Path(path).parent.name == "telemetry":
            allowed = {"kvwatch.engine", "kvwatch.engine.events", "kvwatch.engine.probe"}
            assert engine <= allowed, f"{path} reaches into {sorted(engine - allowed)}"
        else:
            assert engine <= ENGINE_API, f"{path} reaches into {sorted(engine - ENGINE_API)}"


OUTSIDE_THE_ENGINE = (
    "server",
    "telemetry",
    "gate",
    "loadtests",
    "kvwatch",
    "mutation",
    "targets",
    "dashboards",
)
# the engine's parts and their state: reached only through the engine's methods
ENGINE_INTERNALS = frozenset(
    {
        "scheduler",
        "cache",
        "runner",
        "requests",
        "sessions",
        "holder",
        "lock_node",
        "computed_len",
        "cached_len",
        "in_flight",
        "waiting",
        "running",
        "tree",
        "pools",
    }
)


def _is_engine(node: ast.expr) -> bool:
    """``engine``, ``Engine`` or ``<anything>.engine`` (``worker.engine``, ``self.engine``):
    the names this code base gives our engine. vLLM's objects go by other names."""
    if isinstance(node, ast.Name):
        return node.id in ("engine", "Engine")
    return isinstance(node, ast.Attribute) and node.attr == "engine"


def engine_reach_through(source: str) -> list[str]:
    """Attribute reads off an engine object that pass its public API: a private
    name (``engine._x``; dunders aside) or one of its parts (``engine.sessions``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute) or not _is_engine(node.value):
            continue
        private = node.attr.startswith("_") and not node.attr.startswith("__")
        if private or node.attr in ENGINE_INTERNALS:
            found.append((node.lineno, node.col_offset, ast.unparse(node)))
    return [f"line {line}: {code}" for line, _, code in sorted(found)]


def test_code_outside_the_engine_uses_only_its_public_api():
    """The server, telemetry, load, the CLI, the mutation programs and the targets
    read the engine through its methods (``request_info``, ``session_tokens``,
    ``open_sessions``, ``probe``, ...), never through its scheduler, cache,
    request table or session registry."""
    checked = 0
    for folder in OUTSIDE_THE_ENGINE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            checked += 1
            found = engine_reach_through(path.read_text())
            assert not found, f"{path.relative_to(ROOT)} reaches into the engine: {found}"
    assert checked > 50


def test_the_reach_through_check_catches_what_it_is_for():
    planted = (
        "def f(worker, engine, core):\n"
        "    req = worker.engine.requests.get(rid)\n"  # the request table
        "    engine._sessions.open.clear()\n"  # a private name
        "    tokens = engine.sessions.get(sid).tokens\n"  # the session registry
        "    self.engine.scheduler.waiting\n"
        "    Engine._apply_aborts(engine)\n"
        "    core.scheduler.requests\n"  # vLLM's scheduler: not ours
        "    engine.request_info(rid).status, engine.__class__, engine.probe()\n"
    )
    assert engine_reach_through(planted) == [
        "line 2: worker.engine.requests",
        "line 3: engine._sessions",
        "line 4: engine.sessions",
        "line 5: self.engine.scheduler",
        "line 6: Engine._apply_aborts",
    ]


def test_the_gate_process_never_loads_gevent_or_locust():
    """``kvwatch gate`` starts Locust as its own process; monkey-patching stays there."""
    code = (
        "import sys, kvwatch.gate.pipeline, kvwatch.gate.report, kvwatch.cli\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in ('gevent', 'locust'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"the gate imported {out.stdout.strip()}"


def test_the_gate_checks_its_flags_without_loading_torch_or_scipy():
    """Parsing ``--inject`` needs the fault registry, not the engine: a usage error
    answers in well under a second instead of after torch loads."""
    code = (
        "import sys, kvwatch.gate.pipeline, kvwatch.engine.faults as f\n"
        "f.parse_faults(['interior-snapshot-leak'])\n"
        "print(','.join(sorted(m for m in sys.modules if m in ('torch', 'scipy.stats'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"the gate imported {out.stdout.strip()}"
    from kvwatch.engine import Engine, SamplingParams  # the lazy names still resolve

    assert Engine.__name__ == "Engine" and SamplingParams.__name__ == "SamplingParams"


def runtime_imports_of(folder: str) -> dict[str, set[str]]:
    """Like ``imports_of``, leaving out imports under ``if TYPE_CHECKING:``."""
    out = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        tree = ast.parse(path.read_text())
        typing_only = {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
            for n in ast.walk(node)
        }
        names = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
        out[str(path.relative_to(ROOT))] = names
    return out


# package -> the kvwatch packages it may not import at run time: the gate defines what
# it needs from a target (gate/target.py) and never loads one; what Locust loads
# knows no target; targets drive loads through the gate, never Locust's modules
FORBIDDEN_PACKAGES = {
    "gate": ("kvwatch.targets", "kvwatch.loadtests"),
    "loadtests": ("kvwatch.targets",),
    "targets": ("kvwatch.loadtests",),
    "telemetry": ("kvwatch.gate", "kvwatch.targets", "kvwatch.loadtests"),
}


def test_packages_import_in_one_direction():
    for folder, banned in FORBIDDEN_PACKAGES.items():
        for path, names in runtime_imports_of(folder).items():
            bad = sorted(n for n in names if n.startswith(banned))
            assert not bad, f"{path} imports {bad}"


def test_a_planted_import_of_a_target_in_the_gate_is_seen(tmp_path, monkeypatch):
    (tmp_path / "gate").mkdir()
    (tmp_path / "gate" / "x.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from kvwatch.targets.select import choose\n"
        "if TYPE_CHECKING:\n    from kvwatch.targets.vllm_target import VllmTarget\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert runtime_imports_of("gate") == {"gate/x.py": {"typing", "kvwatch.targets.select"}}


def test_no_two_source_modules_share_a_file_name():
    """A reader must never confuse ``a/gate.py`` with ``b/gate.py``."""
    seen: dict[str, str] = {}
    clashes = []
    for folder in (*OUTSIDE_THE_ENGINE, "engine"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name.startswith("__"):
                continue
            rel = str(path.relative_to(ROOT))
            if path.name in seen:
                clashes.append(f"{seen[path.name]} and {rel}")
            seen.setdefault(path.name, rel)
    assert not clashes, clashes
