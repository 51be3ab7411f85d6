"""SGLang's prefix caches as a gate target: ``--engine sglang-cache --sglang-version V``.

SGLang release V's own cache, pool, request, session and batch classes, from
its wheel, run in the gate's process on CPU under a scheduler shim
(``kvwatch.targets.sglang``); no server, no model, no Locust. Its profiles
are the shim's workloads (``agentic``, ``sessions``, ``aborts``,
``pressure``); ``--sglang-cache`` picks the model family whose cache is
built (``radix``: full attention; ``mamba``: hybrid SSM; ``swa``: hybrid
sliding window) and ``--page-size`` the page size (mamba: 1 only, as
SGLang's mamba cache without its extra buffer)::

    serving(profile)   the release loaded once (fetched into the cache folder);
                       ServerError (exit 3) if it cannot be, or no shim drives it
    run(spec)          the profile's workload at spec.concurrency conversations
                       for spec.turns turns, recorded (recorded_run.record_run)

What its records carry (``signals``): probes (the audit of SGLang's pools,
locks and tree counters after every step), registries (every container
SGLang's objects hold) and request counts, so ``allocator``, ``refcount``,
``tree``, ``requests`` and ``quiescence`` judge it. Not ``HEAP``: tracemalloc
files the blocks PyTorch keeps in its small-block pool behind
``Tensor.to(dtype)`` under the SGLang line that called it, so clean releases
(0.5.22 and 0.5.23 with an SWA cache, 0.5.13.post1 under pressure) leave a
few kilobytes "per request" at such lines after the drain that no container
references and whose number saturates; no file scope can tell those blocks
from SGLang's. Nothing is replayed (no model) and there are no gauges.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from kvwatch.harness.progress import Progress
from kvwatch.harness.run_record import RunRecord, Signal
from kvwatch.harness.target import RunSpec, Served, Target
from kvwatch.processes import ServerError
from kvwatch.targets.sglang.cache_workloads import WORKLOADS, Workload
from kvwatch.targets.sglang.wheel_fetch import check_version

if TYPE_CHECKING:
    from kvwatch.targets.sglang.release_import import Release

CACHES = ("radix", "mamba", "swa")


class CacheProfile(NamedTuple):
    """A profile of this target: one of the shim's workloads."""

    name: str
    summary: str
    workload: type[Workload]
    turns: int = 6


PROFILES: Mapping[str, CacheProfile] = {
    name: CacheProfile(name=name, summary=w.summary, workload=w) for name, w in WORKLOADS.items()
}


class SglangCacheTarget(Target):
    name = "sglang-cache"
    signals = frozenset({Signal.PROBES, Signal.REGISTRIES, Signal.REQUESTS})

    def __init__(
        self,
        version: str,
        *,
        cache: str = "radix",
        page_size: int = 1,
        wheel_cache: Path | None = None,  # default: wheel_fetch.cache_dir()
    ) -> None:
        check_version(version)
        if cache not in CACHES:
            raise ValueError(f"--sglang-cache is one of {', '.join(CACHES)}, not {cache!r}")
        if page_size < 1:
            raise ValueError("--page-size must be >= 1")
        if cache == "mamba" and page_size != 1:
            raise ValueError(
                "--sglang-cache mamba runs at --page-size 1 only (SGLang's mamba cache takes "
                "larger pages only with its extra buffer, which this target does not model)"
            )
        self.version, self.cache, self.page_size = version, cache, page_size
        self.wheel_cache = wheel_cache
        self.release: Release | None = None
        self.unavailable: str | None = None  # why the release could not be loaded

    def profiles(self) -> Mapping[str, CacheProfile]:
        return PROFILES

    def loaded(self, profile: CacheProfile, progress: Progress) -> Release:
        """The release, loaded on first use; ServerError when it cannot be had, or no
        shim drives its ``--sglang-cache`` (or, for ``profile``, its sessions)."""
        from kvwatch.targets.sglang.release_import import load
        from kvwatch.targets.sglang.shim_choice import Unsupported, check
        from kvwatch.targets.sglang.wheel_fetch import Unavailable

        if self.unavailable is not None:  # tried once for the gate: not again per profile
            raise ServerError(self.unavailable)
        try:
            if self.release is None:
                progress.say(f"loading sglang {self.version}'s cache modules from its wheel")
                self.release = load(self.version, self.wheel_cache)
        except Unavailable as exc:
            self.unavailable = str(exc)
            raise ServerError(self.unavailable) from None
        try:
            check(self.release, cache=self.cache, sessions=profile.workload.sessions)
        except Unsupported as exc:
            raise ServerError(str(exc)) from None
        return self.release

    @contextlib.contextmanager
    def serving(self, profile: CacheProfile, progress: Progress) -> Iterator[Served]:
        yield SglangServed(self, profile, self.loaded(profile, progress))


class SglangServed(Served):
    def __init__(self, target: SglangCacheTarget, profile: CacheProfile, release: Release) -> None:
        self.target, self.profile, self.release = target, profile, release

    def run(self, spec: RunSpec) -> RunRecord:
        from kvwatch.targets.sglang.recorded_run import record_run

        target = self.target
        workload = self.profile.workload(
            c=spec.concurrency, seed=spec.seed, page_size=target.page_size, cache=target.cache
        )
        return record_run(
            self.release, workload, turns=spec.turns, warmup=spec.warmup, say=spec.progress.say
        )
