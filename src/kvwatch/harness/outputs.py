"""Where ``kvwatch gate`` and ``kvwatch serve`` write, checked before anything is written.

The invariant: every file the gate writes lies inside ``--out`` or is the one
file ``--junit`` names; every file the server writes lies inside ``--run-dir``.
Nothing a flag or a name says can place a file elsewhere or overwrite a file
that no kvwatch run wrote. Three kinds of input reach a path:

* a *name* (a profile, a run, anything that becomes one file or folder) is a
  single path component: not empty, not ``.`` or ``..``, no path separator, no
  control character;
* a *directory* (``--out``, ``--run-dir``) may be relative, absolute or go
  through ``..`` (the user chose it), but holds no control character and is
  not an existing file. ``--out`` must also be new, empty, or a directory an
  earlier gate run wrote (it holds ``MARKER`` or a ``summary.json``), so a
  slip like ``--out .`` or ``--out ~`` cannot spread reports over a source tree;
  the earlier gate's own outputs there are removed before the new run writes;
* a *file* (``--junit``) holds no control character, is not a directory, is
  none of the gate's own outputs, and if it exists it is a JUnit report.

Each check raises ``ValueError`` with the flag and the reason: the CLI's exit 2.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

MARKER = ".kvwatch-out"  # written first into every --out a gate run uses
OWN_FILES = ("summary.json", "report.html", "gate.prom", MARKER)
OWN_DIRS = ("runs", "servers", "spans", "soak")
SEPARATORS = frozenset({"/", "\\", os.sep, os.altsep or "/"})


def _control(text: str) -> str | None:
    for ch in text:
        if ord(ch) < 0x20 or ord(ch) == 0x7F:
            return repr(ch)
    return None


def name(kind: str, value: str) -> str:
    """``value`` as one path component, or ValueError naming ``kind``."""
    if not value or value in (".", ".."):
        raise ValueError(f"{kind} {value!r} is not a usable name")
    if bad := _control(value):
        raise ValueError(f"{kind} {value!r} holds a control character ({bad})")
    if SEPARATORS & set(value) or Path(value).is_absolute():
        raise ValueError(f"{kind} {value!r} must be a plain name, without path separators")
    return value


def child(parent: Path, *names: str) -> Path:
    """``parent / n1 / n2 ...`` with each part checked as a name: it stays under ``parent``."""
    path = parent
    for part in names:
        path = path / name("name", part)
    return path


def directory(flag: str, path: Path) -> Path:
    """A directory the user named: no control character, not an existing file."""
    if not str(path):
        raise ValueError(f"{flag} must not be empty")
    if bad := _control(str(path)):
        raise ValueError(f"{flag} {str(path)!r} holds a control character ({bad})")
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {path} is a file, not a directory")
    return path


def out_dir(path: Path) -> Path:
    """``--out``: a directory as above that is new, empty, or an earlier run's."""
    directory("--out", path)
    if path.is_dir() and not any((path / own).exists() for own in (MARKER, "summary.json")):
        entries = sorted(p.name for p in path.iterdir())
        if entries:
            shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
            raise ValueError(
                f"--out {path} holds files no gate run wrote ({shown}); "
                "give a new or empty directory, or one an earlier gate run wrote"
            )
    return path


def report_file(flag: str, path: Path, out: Path) -> Path:
    """``--junit``: a file that is none of the gate's own outputs and, if it exists, a report."""
    if bad := _control(str(path)):
        raise ValueError(f"{flag} {str(path)!r} holds a control character ({bad})")
    if not path.name or path.is_dir():
        raise ValueError(f"{flag} {path} is a directory; name a file")
    target, root = path.resolve(), out.resolve()
    if target in {root / own for own in OWN_FILES} or any(
        target.is_relative_to(root / own) for own in OWN_DIRS
    ):
        raise ValueError(f"{flag} {path} is one of the files the gate writes in {out}")
    if path.exists() and not _is_junit(path):
        raise ValueError(
            f"{flag} {path} exists and is not a JUnit report; refusing to overwrite it"
        )
    return path


def _is_junit(path: Path) -> bool:
    try:
        head = path.read_bytes()[:512].decode("utf-8", "replace")
    except OSError:
        return False
    return head.lstrip().startswith("<?xml") and "<testsuite" in head


def mark(out: Path) -> None:
    """Create ``out`` and mark it as a gate's output directory; an earlier gate's
    outputs in it go first (``out_dir`` checked it is one), so no run folder,
    report or summary of that gate is left beside the new ones."""
    out.mkdir(parents=True, exist_ok=True)
    if (out / MARKER).exists() or (out / "summary.json").exists():
        for own in OWN_DIRS:
            shutil.rmtree(out / own, ignore_errors=True)
        for own in OWN_FILES:
            (out / own).unlink(missing_ok=True)
    (out / MARKER).write_text("written by kvwatch gate\n")
