"""Histories played on vLLM's scheduler, in vLLM's own Python: the history tier's driver.

``histories.VllmHistoryTarget`` starts this once per hunt (or replay) with the
release's Python and keeps it for every history, so vLLM is imported once::

    python -P -m kvwatch.targets.vllm.history_driver MODEL_DIR
      stdin:  one JSON object a line: {"setup": {...}, "history": History.to_json()}
      stdout: one JSON object a line: {"played": played_to_json(...), "unasked": "..."}
              or {"unsupported": why} (the release cannot build the setup's layout)
              or {"error": why} (the history could not be played at all)

Each history gets a scheduler of its own (``scheduler_build.build`` over the
setup: layout, pool, policy, steps in flight, token budget, context), played
by the same player as every in-process target (``histories/play.py``) over
``HistoryCore``. Anything vLLM prints goes to stderr: stdout carries only the
answers.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

from kvwatch.histories.ops import History
from kvwatch.histories.play import play
from kvwatch.histories.played_json import played_to_json
from kvwatch.targets.vllm.history_core import CoreProbe, HistoryCore
from kvwatch.targets.vllm.kv_groups import Unsupported
from kvwatch.targets.vllm.kv_layout import from_json
from kvwatch.targets.vllm.scheduler_build import build


def answer(model_dir: Path, request: dict) -> dict:
    """One history on a fresh scheduler of the setup ``request`` names."""
    setup = request["setup"]
    try:
        scheduler = build(
            model_dir,
            block_size=setup["block_size"],
            num_blocks=setup["num_blocks"],
            policy=setup.get("policy", "fcfs"),
            in_flight=setup.get("in_flight", 1),
            layout=from_json(setup.get("layout")),
            budget=setup["budget"],
            context=setup["context"],
            options=setup.get("options"),
        )
    except Unsupported as exc:
        return {"unsupported": str(exc)}
    core = HistoryCore(scheduler, setup.get("in_flight", 1), setup["context"])
    played = play(core, CoreProbe(core), History.from_json(request["history"]))
    return {"played": played_to_json(played), "unasked": core.unasked}


def main(argv: list[str]) -> int:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # a GPU build's scheduler, on CPU
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # vLLM's own prints land on stderr
    sys.stdout = sys.stderr
    model_dir = Path(argv[0])
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            out = answer(model_dir, json.loads(line))
        except Exception as exc:  # the driver's own failure: said, and the next one played
            tail = " ".join(traceback.format_exception(exc)[-4:])
            out = {"error": f"{type(exc).__name__}: {exc} | {tail}"[:4000]}
        answers.write(json.dumps(out) + "\n")
        answers.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
