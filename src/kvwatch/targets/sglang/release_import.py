"""SGLang's prefix-cache and scheduling modules from a release's wheel, in this process, on CPU.

``load("0.5.11")`` fetches the release's sources (``wheel_fetch.py``) and
imports the module of every role (``release_layout.py``) unchanged. While
the release is *active*, an import hook serves every ``sglang`` module: the
ones in ``release_layout.REAL`` from the wheel's source, a few fixed
stand-ins with real behaviour (``host_modules.py``), and a stub
for the rest (a ``StubModule`` of ``kvwatch.targets.stand_ins``: any attribute
read from one is a stubbed class); ``triton`` and the GPU packages are
stand-ins too::

    release = load("0.5.11")
    with release.active():        # its modules in sys.modules, the hook first on the path
        Req = release.module("schedule_batch").Req
        ...                       # drive it here: SGLang imports lazily, inside functions
    # sys.modules is as it was before; release.active() again to go on

An ``ImportPlan`` widens that for one ``Release``: more modules imported
from the wheel, more packages stubbed, more fixed stand-ins (or fewer: the
release's own module instead), and stubbed ``Scheduler*Mixin`` bases as plain
empty classes. ``scheduler_imports.PLAN`` is the one the release's own
``Scheduler`` needs; a release loaded without a plan imports the caches only.

While a release is active, ``torch.compile`` hands back what it decorates:
SGLang decorates a few helpers with it at import (``forward_batch_info``),
which imports ``torch._dynamo`` (seconds) to compile code that then runs
eagerly on a host with no model anyway.

Invariant: outside ``active()`` no ``sglang``, ``triton`` or stubbed GPU
module of the release is in ``sys.modules``, and what was there before is
put back; several releases may be loaded, one is active at a time. A
stand-in never holds data SGLang's code reads back as data; where a stub is
read as data anyway (a value stored in a tree node), the views that read
SGLang's structures raise (``cache_views._tensor``).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.util
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from kvwatch.targets.sglang import block_hash, host_modules, release_layout
from kvwatch.targets.sglang.wheel_fetch import Unavailable, fetch
from kvwatch.targets.stand_ins import StubModule

OWNED = ("sglang", "triton", *release_layout.STUBBED_PACKAGES)


class ImportPlan(NamedTuple):
    """What one release imports beyond the caches (``scheduler_imports.PLAN``)."""

    real: tuple[str, ...] = ()  # more modules (or packages) from the wheel, unchanged
    stubbed: tuple[str, ...] = ()  # more top-level packages served as stubs
    fixed: Callable[[], dict[str, types.ModuleType]] | None = None  # more stand-ins
    unfixed: tuple[str, ...] = ()  # stand-ins left out: the release's own module instead
    utils: dict | None = None  # more helpers in the ``sglang.srt.utils`` stand-in
    # a stubbed ``Scheduler*Mixin`` is a plain empty class (missing attributes raise)
    plain_mixins: Callable[[types.ModuleType], types.ModuleType] | None = None

    def is_real(self, name: str) -> bool:
        return release_layout.is_real(name) or any(
            name == r or name.startswith(r + ".") for r in self.real
        )


CACHES_ONLY = ImportPlan()


def _fixed_modules(root: Path, plan: ImportPlan = CACHES_ONLY) -> dict[str, types.ModuleType]:
    """The stand-ins served instead of the release's own module, by name."""
    fixed: dict[str, types.ModuleType] = dict(host_modules.triton_modules())
    for name in ("sglang.srt.utils", "sglang.srt.utils.common"):
        fixed[name] = host_modules.utils_module(name, plan.utils)
    fixed["sglang.srt.server_args"] = host_modules.server_args_module("sglang.srt.server_args")
    fixed["sgl_kernel"] = host_modules.sgl_kernel_module()
    loader = "sglang.srt.utils.cpp_extension_loader"
    fixed[loader] = block_hash.loader_module(loader)
    fixed["sglang.srt.platforms"] = host_modules.platforms_module("sglang.srt.platforms")
    fixed.update(plan.fixed() if plan.fixed is not None else {})
    for name in plan.unfixed:
        fixed.pop(name, None)
    return fixed


class _StubPackage(StubModule):
    """A package of the wheel whose ``__init__`` is not run: its real submodules
    import from ``__path__``, any other attribute is a stub."""

    def __init__(self, name: str, path: Path, real_child: Callable[[str], bool]) -> None:
        super().__init__(name, package=True)
        self.__path__ = [str(path)]
        self._real_child = real_child

    def __getattr__(self, attr: str):
        if not attr.startswith("__") and self._real_child(f"{self.__name__}.{attr}"):
            return importlib.import_module(f"{self.__name__}.{attr}")
        return super().__getattr__(attr)


class _Importer(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``sglang.*`` from the extracted wheel: real modules from source,
    the fixed stand-ins, stubs for the rest; ``triton`` and GPU packages as stand-ins."""

    def __init__(self, root: Path, plan: ImportPlan = CACHES_ONLY) -> None:
        self.root, self.plan = root, plan
        self.owned = (*OWNED, *plan.stubbed)
        self.fixed = _fixed_modules(root, plan)

    def real_child(self, name: str) -> bool:
        real = self.plan.is_real(name)
        return (real and release_layout.module_file(self.root, name) is not None) or (
            self.root / name.replace(".", "/")
        ).is_dir()

    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top not in self.owned:
            return None
        source = release_layout.module_file(self.root, name) if top == "sglang" else None
        if name not in self.fixed and source is not None and self.plan.is_real(name):
            package = [str(source.parent)] if source.name == "__init__.py" else None
            return importlib.util.spec_from_file_location(
                name, source, submodule_search_locations=package
            )
        return importlib.util.spec_from_loader(name, self, is_package=True)

    def create_module(self, spec):
        name = spec.name
        if name in self.fixed:
            return self.fixed[name]
        folder = self.root / name.replace(".", "/")
        if name.split(".")[0] == "sglang" and folder.is_dir():
            module = _StubPackage(name, folder, self.real_child)
        else:
            module = StubModule(name, package=True)
        return self.plan.plain_mixins(module) if self.plan.plain_mixins else module

    def exec_module(self, module):
        pass


def _no_compile(fn: Callable | None = None, **_: object) -> Callable:
    """``torch.compile`` while a release is active: the function as it is."""
    return fn if fn is not None else (lambda f: f)


def _owned(modules: dict[str, types.ModuleType], owned=OWNED) -> dict[str, types.ModuleType]:
    return {k: v for k, v in modules.items() if k.split(".")[0] in owned}


@dataclass
class Release:
    """One release's modules, importable while ``active()``."""

    version: str
    root: Path  # the folder holding the wheel's sglang/
    roles: dict[str, release_layout.Role]
    modules: dict[str, types.ModuleType] = field(default_factory=dict)
    importer: _Importer | None = None
    plan: ImportPlan = CACHES_ONLY

    def has(self, role: str) -> bool:
        return role in self.roles

    def module(self, role: str) -> types.ModuleType:
        return self.modules[self.roles[role].module]

    def cls(self, role: str) -> type:
        role_of = self.roles[role]
        return getattr(self.modules[role_of.module], role_of.cls)

    def relative(self, filename: str) -> str | None:
        """``filename`` as a path inside the wheel (``sglang/srt/...``), or None."""
        try:
            return Path(filename).relative_to(self.root).as_posix()
        except ValueError:
            return None

    @contextlib.contextmanager
    def active(self) -> Iterator[Release]:
        """This release's modules in ``sys.modules`` and its importer first on the
        meta path; on exit both are as before, and what was imported is kept."""
        owned = (*OWNED, *self.plan.stubbed)
        saved = _owned(sys.modules, owned)
        for name in saved:
            del sys.modules[name]
        sys.modules.update(self.modules)
        self.importer = self.importer or _Importer(self.root, self.plan)
        sys.meta_path.insert(0, self.importer)
        import torch

        compile_, torch.compile = torch.compile, _no_compile
        try:
            yield self
        finally:
            torch.compile = compile_
            sys.meta_path.remove(self.importer)
            mine = _owned(sys.modules, owned)
            self.modules.update(mine)
            for name in mine:
                del sys.modules[name]
            sys.modules.update(saved)


def load(version: str, cache: Path | None = None, plan: ImportPlan = CACHES_ONLY) -> Release:
    """Fetch ``version``'s sources and import every role's module; ``Unavailable``
    when the wheel cannot be had or its modules cannot be imported here."""
    root = fetch(version, cache)
    try:
        roles = release_layout.resolve(root)
        release = Release(version=version, root=root, roles=roles, plan=plan)
        with release.active():
            for role in release.roles.values():
                importlib.import_module(role.module)
    except ModuleNotFoundError as exc:  # a host package the release needs (msgspec)
        raise Unavailable(
            f"sglang {version} needs the package {exc.name!r}: pip install 'kvwatch[sglang]'"
        ) from None
    except (LookupError, ImportError, SyntaxError) as exc:
        raise Unavailable(f"sglang {version}: {type(exc).__name__}: {exc}") from None
    return release
