"""One workload on one SGLang release, recorded by the shared driver (``../driver/drive.py``).

``record_run(release, workload, turns=6, warmup=2)`` is what a gate run of
``--engine sglang-cache`` does, in this process::

    release.active(), SGLANG_INVARIANT_CHECK=2 (SGLang's own invariants raise),
                      SGLANG_REQ_WAITING_TIMEOUT and the release's own environment
      drive.record_run(
          make_loop  = loop_choice.make(release, workload.config())   fresh pools and
                       cache: SGLang's own Scheduler, one event-loop iteration a step
          make_probe = CacheProbe                                    audits after every step
          workload, turns, warmup, where_it_broke)                    -> RunRecord
      (the loop's thread ends with the run)

A release that raises ends the run there: the record keeps the turns so far
and says where it broke (``where_it_broke``: the innermost frame in the
wheel).

Invariant: every run starts from new pools, a new cache and a new loop; the
same (release, workload, c, seed, turns) gives the same record but for its
timestamps.
"""

from __future__ import annotations

import contextlib
import logging
import os
import traceback
from collections.abc import Callable, Iterator

from kvwatch.harness.run_record import RunRecord
from kvwatch.targets.driver import drive
from kvwatch.targets.sglang import loop_choice
from kvwatch.targets.sglang.probe import CacheProbe
from kvwatch.targets.sglang.release_import import Release
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


def record_run(
    release: Release,
    workload: Workload,
    *,
    turns: int,
    warmup: int,
    say: Callable[[str], None] = lambda line: None,
) -> RunRecord:
    """Run ``workload`` for ``turns`` turns on ``release`` and return its record."""
    config = workload.config()
    values = {**STRICT_INVARIANTS, **loop_choice.environment(release, config)}
    with release.active(), environment(values):
        record, _ = drive.record_run(
            lambda: loop_choice.make(release, config, seed=workload.seed),
            CacheProbe,
            workload,
            turns=turns,
            warmup=warmup,
            where_it_broke=lambda exc: where_it_broke(release, exc),
            say=say,
        )
        return record
