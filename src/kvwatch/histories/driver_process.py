"""The history tier's player in a process of its own: for engines that run apart from kvwatch.

A ``ProcessHistoryTarget`` (vLLM's, in vLLM's Python) starts this once and
keeps it for every history, naming the factory that builds its engine's loop::

    python -P -m kvwatch.histories.driver_process MODULE:FACTORY ARG
      stdin:  one JSON object a line: {"setup": {...}, "history": History.to_json()}
      stdout: one JSON object a line: {"played": played_to_json(...), "unasked": "..."}
              or {"unsupported": why} (the factory raised ``history_process.Unsupported``: the engine
              cannot build that setup) or {"error": why} (it could not be played at all)

``FACTORY(setup, ARG)`` returns a fresh ``(loop, probe)`` for each history (the
loop an ``EngineLoop``, the probe a ``StepProbe`` over it); the history is
played with the same player as in-process targets (``play.py``). Anything the
engine prints goes to stderr: stdout carries only the answers.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from collections.abc import Callable

from kvwatch.histories.ops import History
from kvwatch.histories.play import play
from kvwatch.histories.played_json import played_to_json
from kvwatch.targets.driver.history_process import Unsupported


def answer(factory: Callable, arg: str, request: dict) -> dict:
    """One history on a fresh loop of the factory's engine."""
    try:
        loop, probe = factory(request["setup"], arg)
    except Unsupported as exc:  # the engine lacks the setup: not a finding
        return {"unsupported": str(exc)}
    played = play(loop, probe, History.from_json(request["history"]))
    return {"played": played_to_json(played), "unasked": loop.unasked}


def main(argv: list[str]) -> int:
    module, _, name = argv[0].partition(":")
    factory = getattr(importlib.import_module(module), name)
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # the engine's own prints land on stderr
    sys.stdout = sys.stderr
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            out = answer(factory, argv[1], json.loads(line))
        except Exception as exc:  # the driver's own failure: said, and the next one played
            tail = " ".join(traceback.format_exception(exc)[-4:])
            out = {"error": f"{type(exc).__name__}: {exc} | {tail}"[:4000]}
        answers.write(json.dumps(out) + "\n")
        answers.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
