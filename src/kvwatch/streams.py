"""Lines to stdout and stderr that a reader who left cannot turn into an exit code.

What ``kvwatch gate`` prints is a copy for people; its verdict is the exit
code and ``summary.json``. When the reader of a pipe goes away
(``kvwatch gate ... | head -n 3``, a CI log collector that closes early),
the next write raises ``BrokenPipeError``. Let through, it would end the
gate before ``summary.json`` is written; caught at the top and answered
with exit 0, it turned a leak into a green build. Here a stream whose
reader left is pointed at ``/dev/null`` and every later line on it is
dropped: the command runs to its end and exits with its own code.

``out`` is for results (what a script greps: per-run lines, failures with
their evidence, the verdict); ``err`` for progress and diagnostics.
"""

from __future__ import annotations

import os
import sys

_gone: set[str] = set()  # the streams whose reader left


def out(line: str = "") -> None:
    """A result line on stdout."""
    _write("stdout", line)


def err(line: str = "") -> None:
    """A progress or diagnostic line on stderr."""
    _write("stderr", line)


def closed(name: str) -> bool:
    """Whether ``stdout`` or ``stderr`` lost its reader during this process."""
    return name in _gone


def settle() -> None:
    """Flush both streams now, while a closed pipe can still be caught, so that
    Python's own flush at exit neither prints a traceback nor exits 120."""
    for name in ("stdout", "stderr"):
        _write(name, None)


def _write(name: str, line: str | None) -> None:
    stream = getattr(sys, name)
    if stream is None or name in _gone:
        return
    try:
        if line is not None:
            stream.write(line + "\n")
        stream.flush()
    except BrokenPipeError:
        _discard(name)
    except ValueError:  # the stream object itself was closed
        _gone.add(name)


def _discard(name: str) -> None:
    """Point the stream's file descriptor at /dev/null: what its buffer still
    holds is flushed there at exit, and later writes cost nothing."""
    _gone.add(name)
    stream = getattr(sys, name)
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, stream.fileno())
        finally:
            os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no descriptor (a test's StringIO)
        setattr(sys, name, open(os.devnull, "w"))  # noqa: SIM115 - lives as long as sys.<name>
