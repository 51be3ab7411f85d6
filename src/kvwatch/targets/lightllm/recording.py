"""One workload on one LightLLM checkout, recorded turn by turn with kvwatch's ``TurnRecorder``.

``record_run(plan, say)`` is what one gate run of ``--engine lightllm-cache``
does, inside its driver process (``run_driver.py``)::

    workload = WORKLOADS[profile](c, seed, cache)
    parts = infer_build.build(checkout, workload.sizes(), token_salt)
                                                             LightLLM's pools, cache, backend
    loop = InferLoop(parts); probe = InferProbe(loop)
    recorder = TurnRecorder(StepSource(probe), watch=True)
    recorder.start()                                         baseline probe, per-step audits
    for t in turns: workload.turn(loop, t) -> recorder.barrier(t, reports)
    recorder.finish(reports)                                 flushed (the cache's own eviction), probed

LightLLM runs with its asserts as it ships them. An exception LightLLM
raises ends the loop there, as it would end its infer process: the probe
then records the state it left (``barrier(t, drain=False)``: a leaked slot
is an ``orphan`` finding the detectors judge) and the run keeps the error,
naming the innermost frame in the checkout (``where_it_broke``). The
barrier reports carry the request counts as a client would count them:
finished as answered, the ones the workload aborted as 4xx, any LightLLM
ended by itself as failed. Beside the record it returns the stand-in model's
tokens: the plan's ``token_salt`` and how many it sampled.
"""

from __future__ import annotations

import contextlib
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvwatch.harness.recorder import RecorderOptions, TurnRecorder
from kvwatch.harness.run_record import KEEP_FAILURES, Counts, RunRecord
from kvwatch.targets.driver.step_probe import StepSource
from kvwatch.targets.lightllm.infer_build import build
from kvwatch.targets.lightllm.loop import ABORTED, FAILED, FINISHED, InferLoop
from kvwatch.targets.lightllm.probe import InferProbe
from kvwatch.targets.lightllm.workloads import WORKLOADS, Workload


def counts(loop: InferLoop) -> dict:
    """The requests ended so far, in the shape of a client process's counts."""
    by_status = Counter(o.status for o in loop.outcomes)
    failures = [
        {
            "name": f"request {o.rid}",
            "status": 0,
            "error": f"LightLLM ended it at iteration {o.iteration}",
        }
        for o in loop.outcomes
        if o.status == FAILED
    ]
    return {
        "status": {"2xx": by_status[FINISHED], "4xx": by_status[ABORTED]},
        "failed": by_status[FAILED],
        "broken_turns": 0,
        "first_failures": failures[:KEEP_FAILURES],
    }


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


def _reports(loop: InferLoop, stats: Any = None) -> list[dict]:
    users = {"process": "driver", "counts": counts(loop)}
    if stats is not None:
        users |= {"conversations": stats.conversations, "context_tokens": stats.context_tokens}
    return [users]


def _drive(loop: InferLoop, workload: Workload, recorder: TurnRecorder, turns: int, say) -> None:
    recorder.start()
    workload.start(loop)
    for t in range(turns):
        try:
            stats = workload.turn(loop, t)
        except Exception:
            with contextlib.suppress(Exception):  # the state LightLLM left, if it reads
                recorder.barrier(t, _reports(loop), drain=False)
            raise
        entry = recorder.barrier(t, _reports(loop, stats))
        flagged = sum(1 for p in entry.probes if p.findings)
        say(
            f"    turn {t}: {stats.conversations} conversations, {flagged} of "
            f"{len(entry.probes)} probes with findings ({t + 1} of {turns} turns, "
            f"iteration {loop.iterations})"
        )
    recorder.finish(_reports(loop))


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
    try:
        loop = InferLoop(build(checkout, workload.sizes(), salt))
    except Exception as exc:  # the checkout's constructors broke: nothing to judge
        unsampled = {"salt": salt, "sampled": 0}
        return RunRecord(turns=(), error=where_it_broke(checkout, exc)), unsampled
    options = RecorderOptions(warmup=plan["warmup"], watch=True, replays=False, drain_timeout=2.0)
    recorder = TurnRecorder(StepSource(InferProbe(loop)), options)
    try:
        _drive(loop, workload, recorder, plan["turns"], say)
    except Exception as exc:  # LightLLM or the workload broke: judge what was recorded
        recorder.broke(where_it_broke(checkout, exc))
        recorder.requests = Counts.from_json(counts(loop))  # what was sent until then
    return recorder.record(), {"salt": salt, "sampled": loop.parts.backend.model.sampled}
