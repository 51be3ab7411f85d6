"""LightLLM's caches as a gate target: ``--engine lightllm-cache --lightllm-src DIR``.

The LightLLM source checkout at DIR runs on CPU, unmodified: its
``RadixCache`` or ``LinearAttPagedRadixCache`` (``--lightllm-cache radix``,
the default, or ``linear``: the hybrid linear-attention cache of Qwen3-Next
and Qwen3.5 models), its memory and request managers and its default
backend's own infer loop (``kvwatch.targets.lightllm``). There is no model,
no router and no server: a stand-in forward writes the KV slots the model
would, a fixed sampler never gives EOS, and the workload plays the
router. Its profiles are the workloads of ``infer_workloads``::

    run(spec)   OUT/runs/P-cN/lightllm-plan.json
                python -m kvwatch.targets.lightllm.run_driver PLAN   (the gate's Python)
                    LightLLM imported from DIR; the profile's turns, probed after
                    every iteration of its loop
                -> lightllm-record.json -> RunRecord

Each run is a driver process of its own (``run_driver.py`` says why: start
args read once per process, module singletons, global CPU changes to
torch). A run that does not end in ``spec.run_timeout`` is killed and is an
error.

What its records carry (``signals``): probes (the audit of LightLLM's pools,
ref counts and tree after every iteration), registries (the containers its
objects hold) and request counts, so ``allocator``, ``refcount``, ``tree``,
``requests`` and ``quiescence`` judge it. Nothing is replayed (no model),
there are no gauges (no server) and no heap samples (the driver's heap is
mostly kvwatch's audit). For the linear cache the root's ref count is not
judged: ``infer_probe.py`` says why.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import ClassVar, NamedTuple

from kvwatch.harness import outputs
from kvwatch.harness.progress import Progress
from kvwatch.harness.run_record import RunRecord, Signal
from kvwatch.harness.target import RunSpec, Served, Target
from kvwatch.processes import ServerError, stop
from kvwatch.targets.lightllm.checkout_check import Checkout
from kvwatch.targets.lightllm.infer_workloads import WORKLOADS

CACHES = ("radix", "linear")
DRIVER = "kvwatch.targets.lightllm.run_driver"
PLAN, RECORD, PROGRESS, LOG = (
    "lightllm-plan.json",
    "lightllm-record.json",
    "lightllm-progress.txt",
    "lightllm.log",
)
NEEDS = ("numpy", "sortedcontainers")  # LightLLM's own imports on the cache path


class LightllmProfile(NamedTuple):
    name: str
    summary: str
    turns: int = 6


PROFILES: Mapping[str, LightllmProfile] = {
    name: LightllmProfile(name=name, summary=w.summary) for name, w in WORKLOADS.items()
}


class LightllmCacheTarget(Target):
    name: ClassVar[str] = "lightllm-cache"
    signals = frozenset({Signal.PROBES, Signal.REGISTRIES, Signal.REQUESTS})
    independent_profiles: ClassVar[bool] = True  # a driver process per run, nothing shared

    def __init__(
        self, checkout: Checkout, *, cache: str = "radix", python: str = sys.executable
    ) -> None:
        if cache not in CACHES:
            raise ValueError(f"--lightllm-cache is one of {', '.join(CACHES)}, not {cache!r}")
        self.checkout, self.cache, self.python = checkout, cache, python

    def profiles(self) -> Mapping[str, LightllmProfile]:
        return PROFILES

    @contextlib.contextmanager
    def started(self, progress: Progress) -> Iterator[None]:
        progress.say(f"{self.checkout.describe()}: its {self.cache} cache and infer loop on CPU")
        yield

    @contextlib.contextmanager
    def serving(self, profile: LightllmProfile, progress: Progress) -> Iterator[Served]:
        missing = [name for name in NEEDS if importlib.util.find_spec(name) is None]
        if missing:
            raise ServerError(
                f"LightLLM's caches need {', '.join(missing)} in kvwatch's Python "
                "(pip install 'kvwatch[lightllm]')"
            )
        yield LightllmServed(self, profile)


class LightllmServed(Served):
    """Each run a driver process of its own: no state is shared between runs."""

    def __init__(self, target: LightllmCacheTarget, profile: LightllmProfile) -> None:
        self.target, self.profile = target, profile

    def plan(self, spec: RunSpec, paths: dict[str, Path]) -> dict:
        return {
            "checkout": str(self.target.checkout.path),
            "cache": self.target.cache,
            "profile": self.profile.name,
            "concurrency": spec.concurrency,
            "turns": spec.turns,
            "warmup": spec.warmup,
            "seed": spec.seed,
            "record": str(paths[RECORD].absolute()),
            "progress": str(paths[PROGRESS].absolute()),
        }

    def run(self, spec: RunSpec) -> RunRecord:
        paths = {name: outputs.child(spec.where, name) for name in (PLAN, RECORD, PROGRESS)}
        for path in paths.values():
            path.unlink(missing_ok=True)
        paths[PLAN].write_text(json.dumps(self.plan(spec, paths)))
        error = self._drive(paths, spec)
        if error is None and not paths[RECORD].exists():
            error = f"the driver ended without a record (see {spec.where / LOG})"
        if error is not None:
            return RunRecord(turns=(), error=error)
        return RunRecord.from_json(json.loads(paths[RECORD].read_text()))

    def _drive(self, paths: dict[str, Path], spec: RunSpec) -> str | None:
        """The driver to its end, its barrier lines relayed; why it broke, or None."""
        cmd = [self.target.python, "-m", DRIVER, str(paths[PLAN].absolute())]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        seen, deadline = 0, time.monotonic() + spec.run_timeout
        with outputs.child(spec.where, LOG).open("w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            try:
                while proc.poll() is None:
                    if time.monotonic() > deadline:
                        return f"the LightLLM run did not finish in {spec.run_timeout:.0f} s"
                    seen = _relay(spec.progress, paths[PROGRESS], seen)
                    spec.progress.heartbeat(f"LightLLM's infer loop: {seen} of {spec.turns} turns")
                    time.sleep(0.1)
                _relay(spec.progress, paths[PROGRESS], seen)
            finally:
                stop(proc, grace=5)
        if proc.returncode != 0:
            return f"the LightLLM driver exited with {proc.returncode} (see {spec.where / LOG})"
        return None


def _relay(progress: Progress, lines: Path, seen: int) -> int:
    if not lines.exists():
        return seen
    done = lines.read_text().splitlines()
    for line in done[seen:]:
        progress.say(line)
    return len(done)
