"""Layering: the engine core publishes events and never imports telemetry, load or
dashboard code; the HTTP server only reaches telemetry through what it is handed;
the package's parts import downward only, the gate's verdicts on top:

    7  cli, parser(_histories), serve,   the commands: compose the parts below
       __main__
    6  gate | histories                  the verdicts and what reads them (below); never
                                         a target implementation | generated client
                                         histories played through the in-process driver
    5  targets | loadtests               what is gated | what Locust loads: never each other
    4  harness                           what a load run needs: plan, recorder, sources,
                                         Locust runs, the Target seam, profiles
    3  server | dashboards
    2  instrumentation                   OTel listeners and probes
    1  engine
    0  contracts, streams, processes, sockets, kvwatch/__init__

Inside the gate, a folder per job, the pipeline at its root:

    gate/ (options, pipeline, soak)      the pipeline: runs a target, composes the rest
    outputs/ | pytest_plugin/            what reads a verdict: never each other, never
                                         the pipeline; the plugin loads nothing that
                                         runs Locust
    verdicts/ (judge, detectors/, ...)   pure functions of a run record: no other job
                                         of the gate, no engine
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from paths import HUNTS, MUTATION, PACKAGE

FORBIDDEN = ("opentelemetry", "locust", "grafana_client", "grafana_foundation_sdk", "gevent")
ROOT = PACKAGE


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


def imports_of(folder: str, root: Path = ROOT) -> dict[str, set[str]]:
    """Every module each file under ``folder`` imports, by its path below ``root``."""
    out = {}
    for path in sorted((root / folder).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
        out[str(path.relative_to(root))] = names
    return out


# instrumentation's probes: pure reads of this process (the heap, live instances,
# containers), which the server's debug endpoints serve; no OTel in them
PROBES = ("kvwatch.instrumentation.heap_tracker", "kvwatch.instrumentation.census")
PROBES += ("kvwatch.instrumentation.registries",)


def test_the_server_code_imports_no_telemetry():
    """FastAPI itself may load the OTel API; the server's own modules never use it,
    and of instrumentation they import only the probes."""
    for path, names in imports_of("server").items():
        bad = {
            n
            for n in names
            if n.split(".")[0] in FORBIDDEN
            or (n.startswith("kvwatch.instrumentation") and n not in PROBES)
        }
        assert not bad, f"{path} imports {sorted(bad)}"


def test_instrumentations_probes_import_no_telemetry():
    found = imports_of("instrumentation")
    for name in PROBES:
        path = name.removeprefix("kvwatch.").replace(".", "/") + ".py"
        bad = {n for n in found[path] if n.split(".")[0] in FORBIDDEN}
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
    folders = ("instrumentation", "harness", "gate")
    for path, names in {k: v for f in folders for k, v in imports_of(f).items()}.items():
        engine = {n for n in names if n.startswith("kvwatch.engine")}
        if path.startswith("gate/verdicts/"):
            assert not engine, f"{path} imports {sorted(engine)}: verdicts read the run record"
        elif Path(path).name in LISTENERS and Path(path).parent.name == "instrumentation":
            allowed = {"kvwatch.engine", "kvwatch.engine.events", "kvwatch.engine.probe"}
            assert engine <= allowed, f"{path} reaches into {sorted(engine - allowed)}"
        else:
            assert engine <= ENGINE_API, f"{path} reaches into {sorted(engine - ENGINE_API)}"


def test_the_harness_never_imports_the_engine():
    """What a load run needs reaches an engine only through a ``Target``; kvwatch's own
    in-process reference (the cache-off replay) lives with its target
    (``targets/kvwatch/replay.py``)."""
    for path, names in imports_of("harness").items():
        engine = sorted(n for n in names if n.startswith("kvwatch.engine"))
        assert not engine, f"{path} imports {engine}"


# every source folder but the engine's, and the root modules (cli.py, serve.py, ...)
PARTS = ("server", "instrumentation", "harness", "gate", "loadtests", "targets", "dashboards")
OUTSIDE_THE_ENGINE = (*(PACKAGE / part for part in PARTS), MUTATION)


def outside_the_engine() -> list[Path]:
    files = [p for folder in OUTSIDE_THE_ENGINE for p in sorted(folder.rglob("*.py"))]
    return files + sorted(PACKAGE.glob("*.py"))


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
    for path in outside_the_engine():
        checked += 1
        found = engine_reach_through(path.read_text())
        assert not found, f"{path} reaches into the engine: {found}"
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
        "import sys, kvwatch.gate.pipeline, kvwatch.gate.outputs.report, kvwatch.cli\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in ('gevent', 'locust'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"the gate imported {out.stdout.strip()}"


# what starts Locust: the run and soak loops (imported by the targets that run the
# load, and the gate) and the Locust user classes (loaded by Locust itself)
LOCUST_RUNNERS = ("kvwatch.harness.locust_run", "kvwatch.harness.soak_load", "kvwatch.loadtests")


def loaded_by(module: str) -> list[str]:
    """What importing ``module`` in a fresh interpreter loads of Locust, gevent, and
    kvwatch's own modules that run Locust."""
    code = (
        f"import sys, {module}\n"
        "names = [m for m in sys.modules if m.split('.')[0] in ('gevent', 'locust')\n"
        f"         or m.startswith({LOCUST_RUNNERS!r})]\n"
        "print(','.join(sorted(names)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return [name for name in out.stdout.strip().split(",") if name]


def test_the_target_seam_loads_nothing_that_runs_locust():
    """``harness/target.py`` is what the gate and every target share: it names plain
    records (``specs.py``) and loads no code that starts Locust, so nothing imports
    in a circle through it."""
    assert loaded_by("kvwatch.harness.target") == []


def test_loaded_by_sees_the_code_that_runs_locust():
    assert "kvwatch.harness.locust_run" in loaded_by("kvwatch.harness.soak_load")


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


def runtime_imports_of(folder: str, root: Path = ROOT) -> dict[str, set[str]]:
    """Like ``imports_of``, leaving out imports under ``if TYPE_CHECKING:``."""
    out = {}
    for path in sorted((root / folder).rglob("*.py")):
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
        out[str(path.relative_to(root))] = names
    return out


# the package's parts by layer (the module docstring's picture): a module may import
# its own part and the parts of lower layers; two parts on one layer never meet
LAYERS = {
    **dict.fromkeys(("contracts", "streams", "processes", "sockets", "__init__"), 0),
    "engine": 1,
    "instrumentation": 2,
    "server": 3,
    "dashboards": 3,
    "harness": 4,
    "targets": 5,
    "loadtests": 5,
    "gate": 6,
    "histories": 6,
    **dict.fromkeys(("cli", "parser", "parser_histories", "serve", "__main__"), 7),
}


def part_of(module: str) -> str | None:
    """The part of the package ``module`` belongs to (``kvwatch.gate.verdicts.judge``: ``gate``,
    ``kvwatch``: ``__init__``), None outside the package."""
    parts = module.split(".")
    if parts[0] != "kvwatch":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def upward_imports(root: Path) -> list[str]:
    """Every run-time import in the package under ``root`` that goes up a layer, or
    across one to another part."""
    bad = []
    for path, names in runtime_imports_of(".", root).items():
        me = path.split("/")[0].removesuffix(".py")
        for name in sorted(names):
            other = part_of(name)
            if other is None or other not in LAYERS or me not in LAYERS:
                continue
            up = LAYERS[other] > LAYERS[me]
            across = LAYERS[other] == LAYERS[me] and other != me and LAYERS[me] in (3, 5, 6)
            if up or across:
                bad.append(f"{path} imports {name} (layer {LAYERS[other]} from {LAYERS[me]})")
    return bad


def test_every_part_of_the_package_has_a_layer():
    parts = {p.name.removesuffix(".py") for p in PACKAGE.iterdir() if p.suffix == ".py"}
    parts |= {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert parts == set(LAYERS)


def test_packages_import_in_one_direction():
    """What a load run needs (the harness) imports neither targets nor loadtests
    nor the gate; the gate's verdict side is above both and reaches a target only
    through the seam (``harness/target.py``): the next test."""
    assert LAYERS["harness"] < LAYERS["targets"] == LAYERS["loadtests"] < LAYERS["gate"]
    assert upward_imports(PACKAGE) == []


def test_the_gate_never_imports_a_target_or_a_load():
    for path, names in runtime_imports_of("gate").items():
        bad = sorted(n for n in names if n.startswith(("kvwatch.targets", "kvwatch.loadtests")))
        assert not bad, f"{path} imports {bad}"


# what each job of the gate may import of the gate: the verdicts are pure functions
# of a run record; outputs and the pytest plugin read verdicts; the pipeline (the
# modules at the gate's root) composes all three
GATE_JOBS = ("verdicts", "outputs", "pytest_plugin")
GATE_MAY_IMPORT = {
    "verdicts": {"verdicts"},
    "outputs": {"verdicts", "outputs"},
    "pytest_plugin": {"verdicts", "pytest_plugin"},
    "pipeline": {"verdicts", "outputs", "pytest_plugin", "pipeline"},
}


def gate_job(module: str) -> str | None:
    """The job of a gate module: ``kvwatch.gate.outputs.summary`` is ``outputs``,
    ``kvwatch.gate.pipeline`` (a module at the gate's root) ``pipeline``; None
    outside the gate."""
    parts = module.split(".")
    if parts[:2] != ["kvwatch", "gate"]:
        return None
    return parts[2] if len(parts) > 2 and parts[2] in GATE_JOBS else "pipeline"


def gate_job_crossings(root: Path) -> list[str]:
    """Every import in the gate under ``root`` (``TYPE_CHECKING`` ones too: a job that
    needs another's types to speak depends on it) that its job may not make."""
    bad = []
    for path, names in imports_of("gate", root).items():
        me = gate_job("kvwatch." + path.removesuffix(".py").replace("/", "."))
        for name in sorted(names):
            other = gate_job(name)
            if other is not None and other not in GATE_MAY_IMPORT[me]:
                bad.append(f"{path} ({me}) imports {name} ({other})")
    return bad


def test_each_job_of_the_gate_imports_only_what_it_may():
    assert gate_job_crossings(PACKAGE) == []


def test_a_planted_crossing_between_the_gates_jobs_is_seen(tmp_path):
    for job in GATE_JOBS:
        (tmp_path / "gate" / job).mkdir(parents=True)
    (tmp_path / "gate" / "verdicts" / "judge.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from kvwatch.gate.verdicts.detectors import detector_set\n"
        "if TYPE_CHECKING:\n    from kvwatch.gate.outputs.summary import GateSummary\n"
    )
    (tmp_path / "gate" / "outputs" / "console.py").write_text(
        "from kvwatch.gate.pipeline import run_gate\nfrom kvwatch.gate.verdicts import judge\n"
    )
    (tmp_path / "gate" / "pytest_plugin" / "text.py").write_text(
        "from kvwatch.gate.outputs import console\n"
    )
    (tmp_path / "gate" / "pipeline.py").write_text("from kvwatch.gate.outputs import console\n")
    assert gate_job_crossings(tmp_path) == [
        "gate/outputs/console.py (outputs) imports kvwatch.gate.pipeline (pipeline)",
        "gate/pytest_plugin/text.py (pytest_plugin) imports kvwatch.gate.outputs (outputs)",
        "gate/verdicts/judge.py (verdicts) imports kvwatch.gate.outputs.summary (outputs)",
    ]


def plugin_imports() -> set[str]:
    """Every kvwatch module the pytest plugin's modules import, the ones they import
    only once a test is gated included."""
    found = imports_of("gate/pytest_plugin")
    return {n for names in found.values() for n in names if n.startswith("kvwatch.")}


def test_the_pytest_plugin_loads_nothing_that_runs_locust():
    """The plugin loads in every pytest run of anyone who installs kvwatch: neither
    it nor what it imports when a test is gated (the recorder, its probe sources, the
    detectors) may load Locust, gevent or the code that starts Locust."""
    names = plugin_imports()
    runners = sorted(n for n in names if n.startswith((*LOCUST_RUNNERS, "kvwatch.targets")))
    assert runners == []
    assert "kvwatch.harness.recorder" in names  # what a gated test records with
    assert loaded_by(", ".join(sorted(names))) == []


def test_the_pytest_plugin_loads_only_itself_until_a_test_is_gated():
    """docs/contracts.md: the plugin imports the detectors and the recorder only when
    a test is gated."""
    code = (
        "import sys, kvwatch.gate.pytest_plugin.plugin\n"
        "print(','.join(sorted(m for m in sys.modules if m.startswith('kvwatch.'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = out.stdout.strip().split(",")
    assert "kvwatch.gate.pytest_plugin.plugin" in loaded
    assert [m for m in loaded if not m.startswith("kvwatch.gate.pytest_plugin")] == ["kvwatch.gate"]


def test_a_planted_upward_import_is_seen(tmp_path):
    for part in ("harness", "gate", "targets"):
        (tmp_path / part).mkdir()
    (tmp_path / "harness" / "x.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from kvwatch.gate.verdicts.judge import judge\n"  # the harness reaching up to the verdicts
        "if TYPE_CHECKING:\n    from kvwatch.targets.select import choose\n"
    )
    (tmp_path / "gate" / "y.py").write_text("from kvwatch.harness.plan import RunPlan\n")
    (tmp_path / "targets" / "z.py").write_text("import kvwatch.loadtests.agents\n")
    assert upward_imports(tmp_path) == [
        "harness/x.py imports kvwatch.gate.verdicts.judge (layer 6 from 4)",
        "targets/z.py imports kvwatch.loadtests.agents (layer 5 from 5)",
    ]


def stutter(paths: list[Path]) -> list[str]:
    """Modules whose file name repeats their folder's name beside another word
    (``sglang/sglang_hunt.py``, ``gate/gate_metrics.py``): the folder already says
    it. A module named exactly as its folder is the folder's main module
    (``engine/engine.py``: the ``Engine``) and not a repeat. Two folders may each
    hold a ``target.py``; within a folder the file system keeps names apart."""
    return [
        path.as_posix()
        for path in paths
        if not path.name.startswith("__")
        and path.stem != path.parent.name
        and path.parent.name in path.stem.split("_")
    ]


def test_no_module_name_repeats_its_folders_name():
    paths = [*outside_the_engine(), *sorted((PACKAGE / "engine").rglob("*.py"))]
    paths += sorted(HUNTS.rglob("*.py"))
    assert stutter(paths) == []


def test_a_module_that_repeats_its_folders_name_is_seen():
    paths = [Path("t/sglang/sglang_hunt.py"), Path("t/sglang/target.py")]
    paths += [Path("t/vllm/scheduler_target.py"), Path("t/kvwatch/__init__.py")]
    paths += [Path("t/engine/engine.py"), Path("t/gate/gate_metrics.py")]
    assert stutter(paths) == ["t/sglang/sglang_hunt.py", "t/gate/gate_metrics.py"]
