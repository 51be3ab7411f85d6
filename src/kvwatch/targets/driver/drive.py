"""One workload on one ``EngineLoop``, recorded turn by turn with kvwatch's ``TurnRecorder``.

``record_run(make_loop, make_probe, workload, turns=..., warmup=...)`` is what a
gate run of an engine stepped in process does (SGLang in the gate's process,
LightLLM in a driver process of its own)::

    loop = make_loop()                     fresh pools and cache; the engine's own loop
    probe = make_probe(loop)               a StepProbe: audits after every step
    recorder = TurnRecorder(LoopSource(probe, loop), watch=True)
    recorder.start()                       baseline probe, per-step audits on
    workload.start(loop)                   sessions opened, histories seeded
    for t in turns: workload.turn(loop, t) -> recorder.barrier(t, reports)
    workload.close(loop); recorder.finish(reports)   drained, loop.flush(), probed
    loop.close()

The barrier reports carry the live conversations and their tokens, the
requests ended so far as the clients would count them (``counts``: finished
ones as answered, the ones the load ended on purpose as answered 4xx, the
ones the engine ended unasked as failed, with the first few named) and the
sessions the load opened. An engine that raises ends the run there: the
record keeps the turns so far and says where it broke (``where_it_broke``);
where the loop says so (``judged_where_it_broke``) the state the engine left
is probed and the requests sent until then are counted.

Invariant: every run starts from a new loop, so the same (engine build,
workload, c, seed, turns) gives the same record but for its timestamps; the
recorder's flush is the loop's own ``flush``.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable
from typing import Any

from kvwatch.contracts import ProbeReport
from kvwatch.harness.recorder import RecorderOptions, TurnRecorder
from kvwatch.harness.run_record import KEEP_FAILURES, Counts, RunRecord
from kvwatch.harness.sources import CallableSource
from kvwatch.targets.driver.engine_loop import FINISHED, EngineLoop
from kvwatch.targets.driver.step_probe import StepProbe
from kvwatch.targets.driver.workload import TurnStats, Workload


class LoopSource(CallableSource):
    """The recorder's probe source over a loop and its probe: the probe's reports and
    the ones it latched between barriers, the loop's flush and sessions. There is no
    heap sampler (an in-process engine's target does not claim ``Signal.HEAP``) and
    nothing is replayed."""

    def __init__(self, probe: StepProbe, loop: EngineLoop) -> None:
        super().__init__(probe.report, flush=loop.flush)
        self.step_probe, self.loop = probe, loop

    def watch(self) -> None:
        self.step_probe.watch()

    def latched(self) -> list[ProbeReport]:
        return self.step_probe.latched()

    def session_open(self, session_id: str) -> bool:
        return self.loop.session_open(session_id)


def counts(loop: EngineLoop) -> dict:
    """The requests ended so far, in the shape of a client process's counts."""
    by_status = Counter(o.status for o in loop.outcomes)
    failures = [loop.failure(o) for o in loop.outcomes if o.status == loop.unasked]
    return {
        "status": {
            "2xx": by_status[FINISHED],
            "4xx": sum(by_status[s] for s in loop.on_purpose),
        },
        "failed": by_status[loop.unasked],
        "broken_turns": 0,
        "first_failures": failures[:KEEP_FAILURES],
    }


def reports(loop: EngineLoop, workload: Workload, stats: TurnStats | None = None) -> list[dict]:
    """What the clients report at a barrier (one client process: the driver)."""
    users: dict[str, Any] = {"process": "driver", "counts": counts(loop)}
    users["sessions"] = list(workload.opened)
    if stats is not None:
        users |= {"conversations": stats.conversations, "context_tokens": stats.context_tokens}
    return [users]


def _turn(loop: EngineLoop, workload: Workload, recorder: TurnRecorder, t: int) -> TurnStats:
    """One turn; where the loop is judged where it broke, the state it left is probed
    (a barrier that does not drain) before the error goes on."""
    try:
        return workload.turn(loop, t)
    except Exception:
        if loop.judged_where_it_broke:
            with contextlib.suppress(Exception):  # the state the engine left, if it reads
                recorder.barrier(t, reports(loop, workload), drain=False)
        raise


def drive(
    loop: EngineLoop,
    workload: Workload,
    recorder: TurnRecorder,
    turns: int,
    say: Callable[[str], None],
) -> None:
    """The workload's turns on ``loop``, a barrier after each, then its close and the
    recorder's finish; a progress line per barrier."""
    recorder.start()
    workload.start(loop)
    for t in range(turns):
        stats = _turn(loop, workload, recorder, t)
        entry = recorder.barrier(t, reports(loop, workload, stats))
        flagged = sum(1 for p in entry.probes if p.findings)
        say(
            f"    turn {t}: {stats.conversations} conversations, {flagged} of "
            f"{len(entry.probes)} probes with findings ({t + 1} of {turns} turns, "
            f"{loop.step_word} {loop.steps})"
        )
    workload.close(loop)
    recorder.finish(reports(loop, workload))


def record_run(
    make_loop: Callable[[], EngineLoop],
    make_probe: Callable[[EngineLoop], StepProbe],
    workload: Workload,
    *,
    turns: int,
    warmup: int,
    where_it_broke: Callable[[BaseException], str],
    say: Callable[[str], None] = lambda line: None,
) -> tuple[RunRecord, EngineLoop | None]:
    """Run ``workload`` for ``turns`` turns on a new loop; its record, and the loop
    (None when the engine's constructors broke: nothing to judge)."""
    try:
        loop = make_loop()
    except Exception as exc:  # the engine's constructors broke: nothing to judge
        return RunRecord(turns=(), error=where_it_broke(exc)), None
    options = RecorderOptions(warmup=warmup, watch=True, replays=False, drain_timeout=2.0)
    recorder = TurnRecorder(LoopSource(make_probe(loop), loop), options)
    try:
        drive(loop, workload, recorder, turns, say)
    except Exception as exc:  # the engine or the workload broke: judge what was recorded
        recorder.broke(where_it_broke(exc))
        if loop.judged_where_it_broke:
            recorder.requests = Counts.from_json(counts(loop))  # what was sent until then
    finally:
        loop.close()
    return recorder.record(), loop
