"""One workload on one LightLLM checkout, recorded by the shared driver (``../driver/drive.py``).

``record_run(plan, say)`` is what one gate run of ``--engine lightllm-cache``
does, inside its driver process (``run_driver.py``)::

    workload = WORKLOADS[profile](c, seed, cache)
    drive.record_run(
        make_loop  = InferLoop(infer_build.build(checkout, workload.sizes(), token_salt))
                                         LightLLM's pools, cache and backend, one iteration a step
        make_probe = InferProbe          audits after every iteration
        workload, turns, warmup, where_it_broke)          -> RunRecord

LightLLM runs with its asserts as it ships them. An exception LightLLM
raises ends the loop there, as it would end its infer process
(``InferLoop.judged_where_it_broke``): the probe then records the state it
left (a barrier that does not drain: a leaked slot is an ``orphan`` finding
the detectors judge) and the run keeps the error, naming the innermost frame
in the checkout (``where_it_broke``). Beside the record it returns the
stand-in model's tokens: the plan's ``token_salt`` and how many it sampled.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from pathlib import Path

from kvwatch.harness.run_record import RunRecord
from kvwatch.targets.driver import drive
from kvwatch.targets.lightllm.infer_build import build
from kvwatch.targets.lightllm.loop import InferLoop
from kvwatch.targets.lightllm.probe import InferProbe
from kvwatch.targets.lightllm.workloads import WORKLOADS


def where_it_broke(checkout: Path, exc: BaseException) -> str:
    """The exception and the innermost frame in the checkout's files (else it is kvwatch's)."""
    root = str(Path(checkout).resolve())
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(root)]
    what = f"{type(exc).__name__}: {exc}".rstrip(": ")
    if not frames:
        return f"driving LightLLM: {what}"
    frame = frames[-1]
    where = Path(frame.filename).relative_to(root)
    return (
        f"LightLLM raised {what} in {where}:{frame.lineno} ({frame.name}); its infer loop "
        f"stops there, so the run ends with the state it left"
    )


def record_run(
    plan: dict, say: Callable[[str], None] = lambda line: None
) -> tuple[RunRecord, dict]:
    """Run the plan's workload for its turns on its checkout; its record, and the
    stand-in model's tokens (``{"salt": ..., "sampled": ...}``)."""
    checkout = Path(plan["checkout"])
    workload = WORKLOADS[plan["profile"]](
        c=plan["concurrency"], seed=plan["seed"], cache=plan["cache"]
    )
    salt = plan.get("token_salt", 0)
    record, loop = drive.record_run(
        lambda: InferLoop(build(checkout, workload.sizes(), salt)),
        InferProbe,
        workload,
        turns=plan["turns"],
        warmup=plan["warmup"],
        where_it_broke=lambda exc: where_it_broke(checkout, exc),
        say=say,
    )
    sampled = loop.parts.backend.model.sampled if isinstance(loop, InferLoop) else 0
    return record, {"salt": salt, "sampled": sampled}
