"""A release's Python sources, from its PyPI wheel, downloaded once into a cache folder.

``fetch("0.5.11")`` runs ``pip download --no-deps sglang==0.5.11`` (the
wheel as published, for CPython 3.11 on manylinux x86_64 whatever this host
is: only its ``.py`` files are used) into ``cache_dir()/0.5.11/`` and
extracts ``sglang/**/*.py`` next to it, into ``src/`` (the wheel is then
deleted). Nothing of SGLang is kept in this repository; the cache folder is::

    $KVWATCH_CACHE/sglang/V/         when KVWATCH_CACHE is set
    $XDG_CACHE_HOME/kvwatch/sglang/V/   else, when XDG_CACHE_HOME is set
    ~/.cache/kvwatch/sglang/V/          else

Invariant: ``src/sglang`` appears whole or not at all (extracted into a
temporary folder and renamed), so two processes fetching the same release
at once both end with the same sources.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

CACHE_ENV = "KVWATCH_CACHE"
DOWNLOAD_TIMEOUT_S = 900
# a PEP 440 release: 0.5.23, 0.5.10rc0, 0.5.4.post3 (never a range or a URL)
VERSION = re.compile(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?")
# the wheel as published for CPython 3.11 on Linux (the .py files are the same on every
# platform; 0.5.11+ ships platform wheels only)
PLATFORM = ("--python-version", "3.11", "--platform", "manylinux_2_34_x86_64")


class Unavailable(RuntimeError):
    """The release's wheel could not be downloaded or read (no network, no such release)."""


def check_version(version: str) -> str:
    """``version`` if it names one release; ValueError otherwise."""
    if not VERSION.fullmatch(version):
        raise ValueError(f"--sglang-version takes a release such as 0.5.23, not {version!r}")
    return version


def cache_dir() -> Path:
    if root := os.environ.get(CACHE_ENV):
        return Path(root).expanduser() / "sglang"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "kvwatch" / "sglang"


def download(version: str, folder: Path) -> Path:
    """The wheel of ``version`` in ``folder`` (downloaded unless it is there)."""
    found = sorted(folder.glob("sglang-*.whl"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix="download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet"]
        cmd += ["--only-binary=:all:", *PLATFORM, f"sglang=={version}", "-d", tmp]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise Unavailable(f"pip download sglang=={version}: no answer in time") from None
        wheels = sorted(Path(tmp).glob("sglang-*.whl"))
        if done.returncode or not wheels:
            why = done.stderr.strip().splitlines()[-1:] or ["no wheel"]
            raise Unavailable(f"pip download sglang=={version}: {why[0]}")
        target = folder / wheels[0].name
        os.replace(wheels[0], target)
    return target


def extract(wheel: Path, src: Path) -> None:
    """``sglang/**/*.py`` of ``wheel`` into ``src`` (whole, or not at all)."""
    tmp = Path(tempfile.mkdtemp(dir=src.parent, prefix="src-"))
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = [n for n in archive.namelist() if n.startswith("sglang/") and n.endswith(".py")]
            archive.extractall(tmp, members=names)
        try:
            os.rename(tmp, src)
        except OSError:  # another process got there first
            if not (src / "sglang").is_dir():
                raise
    except (OSError, zipfile.BadZipFile) as exc:
        raise Unavailable(f"cannot read {wheel}: {exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def fetch(version: str, cache: Path | None = None) -> Path:
    """The folder holding ``sglang/`` of release ``version`` (downloaded and extracted once)."""
    folder = (cache or cache_dir()) / check_version(version)
    src = folder / "src"
    if not (src / "sglang").is_dir():
        wheel = download(version, folder)
        extract(wheel, src)
        wheel.unlink(missing_ok=True)  # its sources are what is kept
    return src
