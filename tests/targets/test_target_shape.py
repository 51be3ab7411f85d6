"""Every engine folder under ``targets/`` has the shape ``targets/README.md`` writes down.

Each holds a ``README.md`` that maps every module in it, an ``__init__.py``, and a
``target.py``: the ``Target`` ``select.py`` builds. A folder with a ``loop.py``
(an engine kvwatch steps itself) implements the shared ``EngineLoop`` there. The
shared driver and the hunts map their modules the same way.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from paths import PACKAGE, REPO

TARGETS = PACKAGE / "targets"
ENGINES = sorted(p for p in TARGETS.iterdir() if p.is_dir() and p.name not in ("driver",))
MAPPED = [*ENGINES, TARGETS / "driver", REPO / "hunts"]


def unmapped(folder: Path) -> list[str]:
    """The modules of ``folder`` its README does not name."""
    text = (folder / "README.md").read_text()
    modules = sorted(p.name for p in folder.glob("*.py") if p.name != "__init__.py")
    return [m for m in modules if f"`{m}`" not in text]


def base_names(path: Path) -> set[str]:
    """The names the classes of ``path`` derive from."""
    tree = ast.parse(path.read_text())
    return {
        ast.unparse(base).split(".")[-1]
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        for base in node.bases
    }


def test_the_engines_are_the_folders_the_readme_names():
    assert [p.name for p in ENGINES] == ["http", "kvwatch", "lightllm", "sglang", "vllm"]
    readme = (TARGETS / "README.md").read_text()
    assert all(f"`{p.name}/`" in readme for p in ENGINES)


@pytest.mark.parametrize("folder", ENGINES, ids=lambda p: p.name)
def test_an_engine_folder_has_a_readme_an_init_and_its_target(folder):
    assert (folder / "README.md").is_file() and (folder / "__init__.py").is_file()
    assert "Target" in base_names(folder / "target.py")
    if (folder / "loop.py").exists():
        assert "EngineLoop" in base_names(folder / "loop.py")


@pytest.mark.parametrize("folder", MAPPED, ids=lambda p: p.name)
def test_each_readme_maps_every_module_of_its_folder(folder):
    assert unmapped(folder) == []


def test_a_module_the_readme_leaves_out_is_seen(tmp_path):
    (tmp_path / "README.md").write_text("| `target.py` | the target |\n")
    for name in ("__init__.py", "target.py", "loop.py"):
        (tmp_path / name).write_text("")
    assert unmapped(tmp_path) == ["loop.py"]
    (tmp_path / "loop.py").write_text("class L(driver.EngineLoop):\n    pass\n")
    assert base_names(tmp_path / "loop.py") == {"EngineLoop"}
