"""One gate run of ``--engine lightllm-cache``, in a process of its own.

``target.py`` starts this with the gate's own Python for each run::

    python -m kvwatch.targets.lightllm.run_driver PLAN.json

The plan names the checkout, the cache (``radix`` or ``linear``), the
profile, the concurrency, the turns, the warm-up and the seed, and where to
write. The driver imports the checkout (``source_hooks``), records the run
(``recording.record_run``, through the shared driver), writes one line per barrier to the plan's
``progress`` file and the run's ``RunRecord`` as JSON to its ``record``, with
``tokens``: the stand-in model's token salt (the plan's ``token_salt``, 0
when absent) and how many tokens it sampled.

Why a process per run: LightLLM reads its start args once per process
(``get_env_start_args`` is ``lru_cache``d) and keeps module singletons
(``g_infer_context``, the tree's time-id generator), each profile needs its
own pool sizes, and running on CPU needs global changes to torch
(``cpu_torch.py``) that must not reach the gate's process. A process of its
own also bounds a run that hangs (the target kills it at the run's
timeout) and keeps a crash in LightLLM's code from taking the gate down.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from kvwatch.targets.lightllm.recording import record_run


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    plan = json.loads(Path(args[0]).read_text())
    torch.set_num_threads(1)
    progress = Path(plan["progress"])

    def say(line: str) -> None:
        with progress.open("a") as out:
            out.write(line.rstrip("\n") + "\n")

    record, tokens = record_run(plan, say)
    Path(plan["record"]).write_text(json.dumps({**record.to_json(), "tokens": tokens}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
