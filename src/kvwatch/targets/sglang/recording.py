"""One workload on one release, recorded turn by turn with kvwatch's ``TurnRecorder``.

``record_run(release, workload, turns=6, warmup=2)`` is what a gate run of
``--engine sglang-cache`` does, in this process::

    release.active(), SGLANG_INVARIANT_CHECK=2 (SGLang's own invariants raise),
                      SGLANG_REQ_WAITING_TIMEOUT (own scheduler)
      shim = loop_choice.make(release, workload.config())     fresh pools and cache:
             SGLang's own Scheduler, stepped one event-loop iteration at a time
      probe = CacheProbe(shim); recorder = TurnRecorder(ShimSource(probe), watch=True)
      recorder.start()                       baseline probe, per-step audits on
      workload.start(shim)                   sessions opened, histories seeded
      for t in turns: workload.turn(shim, t) -> recorder.barrier(t, reports)
      workload.close(shim); recorder.finish(reports)   drained, flushed, probed
      shim.close()                           the own scheduler's loop thread ends

The barrier reports carry the live conversations and their tokens, the
requests ended so far as the clients would count them (``counts``: finished
ones as answered, the ones the load ended on purpose as answered 4xx, the
ones SGLang ended without being asked as failed), and the sessions the load
opened. A release or shim that raises ends the run there: the record keeps
the turns so far and says where it broke (``error``, the innermost frame in
the wheel).

Invariant: every run starts from new pools, a new cache and a new shim; the
same (release, workload, c, seed, turns) gives the same record but for its
timestamps.
"""

from __future__ import annotations

import contextlib
import logging
import os
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from kvwatch.harness.recorder import RecorderOptions, TurnRecorder
from kvwatch.harness.run_record import KEEP_FAILURES, RunRecord
from kvwatch.targets.sglang import loop_choice
from kvwatch.targets.sglang.loop_parts import ABORTED_BY_SGLANG, FINISHED, ON_PURPOSE
from kvwatch.targets.sglang.probe import CacheProbe
from kvwatch.targets.sglang.release_import import Release
from kvwatch.targets.sglang.shim_source import ShimSource
from kvwatch.targets.sglang.workloads import Workload

STRICT_INVARIANTS = {"SGLANG_INVARIANT_CHECK": "2"}  # InvariantCheckLevel.STRICT (0.5.22+)


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` in ``os.environ`` (SGLang reads them lazily) and SGLang's loggers
    quiet, until the block ends."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    logger = logging.getLogger("sglang")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def counts(shim: Any) -> dict:
    """The requests ended so far, in the shape of a client process's counts."""
    by_status = Counter(o.status for o in shim.outcomes)
    failures = [
        {
            "name": o.rid,
            "status": 0,
            "error": f"SGLang aborted it at step {o.step}" + (f": {o.why}" if o.why else ""),
        }
        for o in shim.outcomes
        if o.status == ABORTED_BY_SGLANG
    ]
    status = {"2xx": by_status[FINISHED], "4xx": sum(by_status[s] for s in ON_PURPOSE)}
    return {
        "status": status,
        "failed": by_status[ABORTED_BY_SGLANG],
        "broken_turns": 0,
        "first_failures": failures[:KEEP_FAILURES],
    }


def where_it_broke(release: Release, exc: BaseException) -> str:
    """The exception and, when it went through the release's own files, the innermost
    frame there (else it is the target's own)."""
    frames = traceback.extract_tb(exc.__traceback__)
    inside = [(path, f) for f in frames if (path := release.relative(f.filename)) is not None]
    what = f"{type(exc).__name__}: {exc}"
    if not inside:
        return f"driving sglang {release.version}: {what}"
    path, frame = inside[-1]
    return f"sglang {release.version} raised {what} in {path}:{frame.lineno} ({frame.name})"


def _reports(shim: Any, workload: Workload, stats: Any = None) -> list[dict]:
    users = {"process": "shim", "counts": counts(shim), "sessions": list(workload.opened)}
    if stats is not None:
        users |= {"conversations": stats.conversations, "context_tokens": stats.context_tokens}
    return [users]


def _drive(shim: Any, workload: Workload, recorder: TurnRecorder, turns: int, say) -> None:
    recorder.start()
    workload.start(shim)
    for t in range(turns):
        stats = workload.turn(shim, t)
        entry = recorder.barrier(t, _reports(shim, workload, stats))
        flagged = sum(1 for p in entry.probes if p.findings)
        say(
            f"    turn {t}: {stats.conversations} conversations, {flagged} of "
            f"{len(entry.probes)} probes with findings ({t + 1} of {turns} turns, "
            f"step {shim.step_no})"
        )
    workload.close(shim)
    recorder.finish(_reports(shim, workload))


def record_run(
    release: Release,
    workload: Workload,
    *,
    turns: int,
    warmup: int,
    say: Callable[[str], None] = lambda line: None,
) -> RunRecord:
    """Run ``workload`` for ``turns`` turns on ``release`` and return its record."""
    options = RecorderOptions(warmup=warmup, watch=True, replays=False, drain_timeout=2.0)
    config = workload.config()
    values = {**STRICT_INVARIANTS, **loop_choice.environment(release, config)}
    with release.active(), environment(values):
        try:
            shim = loop_choice.make(release, config, seed=workload.seed)
        except Exception as exc:  # the release's constructors broke: nothing to judge
            return RunRecord(turns=(), error=where_it_broke(release, exc))
        recorder = TurnRecorder(ShimSource(CacheProbe(shim)), options)
        try:
            _drive(shim, workload, recorder, turns, say)
        except Exception as exc:  # the release or the driver broke: judge what was recorded
            recorder.broke(where_it_broke(release, exc))
        finally:
            shim.close()
        return recorder.record()
