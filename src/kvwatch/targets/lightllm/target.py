"""LightLLM's caches as a gate target: ``--engine lightllm-cache --lightllm-src DIR``.

The LightLLM source checkout at DIR runs on CPU, unmodified: its
``RadixCache`` or ``LinearAttPagedRadixCache`` (``--lightllm-cache radix``,
the default, or ``linear``: the hybrid linear-attention cache of Qwen3-Next
and Qwen3.5 models), its memory and request managers and its default
backend's own infer loop (``kvwatch.targets.lightllm``). There is no model,
no router and no server: a stand-in forward writes the KV slots the model
would, a fixed sampler never gives EOS, and the workload plays the
router. Its profiles are the workloads of ``workloads``::

    run(spec)   OUT/runs/P-cN/lightllm-plan.json
                python -m kvwatch.targets.lightllm.run_driver PLAN   (the gate's Python)
                    LightLLM imported from DIR; the profile's turns, probed after
                    every iteration of its loop
                -> lightllm-record.json -> RunRecord

Each run is a driver process of its own (``run_driver.py`` says why: start
args read once per process, module singletons, global CPU changes to
torch), run and followed by ``kvwatch.targets.driver.process``. A run that
does not end in ``spec.run_timeout`` is killed and is an error.

What its records carry (``signals``): probes (the audit of LightLLM's pools,
ref counts and tree after every iteration), registries (the containers its
objects hold) and request counts, so ``allocator``, ``refcount``, ``tree``,
``requests`` and ``quiescence`` judge it. Nothing is replayed (no model),
there are no gauges (no server) and no heap samples (the driver's heap is
mostly kvwatch's audit). For the linear cache the root's ref count is not
judged: ``probe.py`` says why.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Iterator, Mapping
from typing import ClassVar, NamedTuple

from kvwatch.harness.progress import Progress
from kvwatch.harness.run_record import RunRecord, Signal
from kvwatch.harness.target import RunSpec, Served, Target
from kvwatch.processes import ServerError
from kvwatch.targets.driver import process
from kvwatch.targets.driver.process import Driver, DriverFiles
from kvwatch.targets.lightllm.checkout_check import Checkout
from kvwatch.targets.lightllm.workloads import WORKLOADS

CACHES = ("radix", "linear")
DRIVER = "kvwatch.targets.lightllm.run_driver"
FILES = DriverFiles(
    plan="lightllm-plan.json",
    record="lightllm-record.json",
    progress="lightllm-progress.txt",
    log="lightllm.log",
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

    def plan(self, spec: RunSpec) -> dict:
        return {
            "checkout": str(self.target.checkout.path),
            "cache": self.target.cache,
            "profile": self.profile.name,
            "concurrency": spec.concurrency,
            "turns": spec.turns,
            "warmup": spec.warmup,
            "seed": spec.seed,
        }

    def driver(self, spec: RunSpec) -> Driver:
        return Driver(
            command=(self.target.python, "-m", DRIVER),
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            files=FILES,
            run_name="the LightLLM run",
            driver_name="the LightLLM driver",
            line=lambda line: line,
            heartbeat=lambda seen: f"LightLLM's infer loop: {seen} of {spec.turns} turns",
            poll_s=0.1,
        )

    def run(self, spec: RunSpec) -> RunRecord:
        return process.run(self.driver(spec), spec, self.plan(spec), RunRecord.from_json)
