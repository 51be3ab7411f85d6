"""A release's own SGLang scheduler driven by a workload in the test's process.

``load(version)`` is the release (the test skipped, saying why, when its
wheel cannot be had); ``drive(release, workload, turns, then)`` runs the
workload's turns on a fresh driver with SGLang's strict invariants and the
run's environment, calls ``then(driver)`` while the release is still active,
and closes the driver: it returns the driver, or what ``then`` returned.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvwatch.targets.sglang import loop_choice, wheel_fetch
from kvwatch.targets.sglang.recording import STRICT_INVARIANTS, environment


def load(version: str) -> Any:
    try:
        return loop_choice.load(version)
    except wheel_fetch.Unavailable as exc:
        pytest.skip(f"cannot download sglang {version}'s wheel (is PyPI reachable?): {exc}")


def drive(
    release: Any, workload: Any, turns: int = 1, then: Callable[[Any], Any] | None = None
) -> Any:
    config = workload.config()
    values = {**STRICT_INVARIANTS, **loop_choice.environment(release, config)}
    with release.active(), environment(values):
        driver = loop_choice.make(release, config, seed=workload.seed)
        try:
            workload.start(driver)
            for t in range(turns):
                workload.turn(driver, t)
            return then(driver) if then is not None else driver
        finally:
            driver.close()
