"""``--lightllm-src DIR``: whether DIR is a LightLLM source checkout this target can drive.

``find_checkout(DIR, cache)`` answers a ``Checkout`` (the folder, resolved;
the git commit when DIR is a git work tree; whether it has the
linear-attention cache), or raises ``ValueError`` with the message the user
reads (the gate's exit 2): DIR missing, not a LightLLM checkout (no
``lightllm/server/router/dynamic_prompt/radix_cache.py`` or no chunked-prefill
backend), or, for ``--lightllm-cache linear``, a checkout from before
LightLLM's ``LinearAttPagedRadixCache`` (``linear_att_radix_cache.py``,
LightLLM PR #1265).

``export(REPO, COMMIT, WHERE)`` writes one commit of a LightLLM git
repository as a folder (``git archive``, once), with the commit in
``COMMIT_FILE``, which ``commit_of`` reads where the folder is no git work tree.

Invariant: reads files and ``git rev-parse``, never runs LightLLM's code.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import NamedTuple

PROMPT_CACHES = Path("lightllm/server/router/dynamic_prompt")
NEEDED = (
    PROMPT_CACHES / "radix_cache.py",
    Path("lightllm/server/router/model_infer/infer_batch.py"),
    Path("lightllm/server/router/model_infer/mode_backend/chunked_prefill/impl.py"),
)
LINEAR = PROMPT_CACHES / "linear_att_radix_cache.py"
COMMIT_FILE = ".kvwatch-commit"  # what ``export`` writes beside the tree


class Checkout(NamedTuple):
    path: Path
    commit: str | None  # None: not a git work tree
    linear: bool  # has LinearAttPagedRadixCache

    def describe(self) -> str:
        at = f" at {self.commit[:12]}" if self.commit else ""
        return f"LightLLM {self.path}{at}"


def commit_of(path: Path) -> str | None:
    """The commit ``path`` holds: its ``COMMIT_FILE`` (an ``export``), else ``HEAD`` where
    ``path`` is itself the top of a git work tree (not a folder inside another one)."""
    marker = path / COMMIT_FILE
    if marker.is_file():
        return marker.read_text().strip() or None
    try:
        out = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "--show-toplevel", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.split()
    if out.returncode != 0 or len(lines) != 2 or Path(lines[0]) != path.resolve():
        return None
    return lines[1] if len(lines[1]) == 40 else None


def export(repo: Path, commit: str, where: Path) -> Path:
    """``commit`` of the git repository ``repo``, written once under ``where`` (``git
    archive``: no ``.git`` of its own; the full commit in ``COMMIT_FILE``)."""
    folder = where / f"checkout-{commit[:12]}"
    if not (folder / COMMIT_FILE).is_file():
        full = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--verify", f"{commit}^{{commit}}"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        archive = subprocess.run(
            ["git", "-C", str(repo), "archive", "--format=tar", full],
            capture_output=True, check=True,
        )  # fmt: skip
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
        (folder / COMMIT_FILE).write_text(full + "\n")
    return folder


def find_checkout(folder: str | Path, cache: str) -> Checkout:
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise ValueError(f"--lightllm-src {folder}: no such folder")
    missing = [str(p) for p in NEEDED if not (path / p).is_file()]
    if missing:
        raise ValueError(
            f"--lightllm-src {folder} is not a LightLLM source checkout (no {missing[0]})"
        )
    linear = (path / LINEAR).is_file()
    if cache == "linear" and not linear:
        raise ValueError(
            f"--lightllm-cache linear: {folder} has no {LINEAR} (LightLLM's "
            "LinearAttPagedRadixCache, added by its PR #1265)"
        )
    return Checkout(path=path.resolve(), commit=commit_of(path), linear=linear)
