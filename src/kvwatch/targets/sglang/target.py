"""SGLang's prefix caches as a gate target: ``--engine sglang-cache --sglang-version V``.

SGLang release V's own scheduler, cache, pool, request, session and batch
classes, from its wheel, run in the gate's process on CPU
(``kvwatch.targets.sglang``): the release's own ``Scheduler``, built by its
own ``__init__`` (0.5.4.post3 .. 0.5.23; ``loop_choice`` says how, and why
not for a release it cannot build); no server, no model,
no Locust. Its profiles are the workloads of ``workloads`` and
``scheduler_workloads``, run through the shared in-process driver (``recording``);
``--sglang-cache`` picks the model family whose cache is
built (``radix``: full attention; ``mamba``: hybrid SSM; ``swa``: hybrid
sliding window) and ``--page-size`` the page size (mamba: 1 only, as
SGLang's mamba cache without its extra buffer)::

    selected(names)    every profile the release's driver runs (or those named:
                       a profile it cannot run is an error, exit 3, saying why)
    serving(profile)   the release loaded once (fetched into the cache folder);
                       ServerError (exit 3) if it cannot be, or nothing drives
                       the profile on it
    run(spec)          the profile's workload at spec.concurrency conversations
                       for spec.turns turns, recorded (recording.record_run)

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
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from kvwatch.harness.progress import Progress
from kvwatch.harness.run_record import RunRecord, Signal
from kvwatch.harness.target import RunSpec, Served, Target
from kvwatch.processes import ServerError
from kvwatch.targets.sglang import scheduler_workloads, workloads
from kvwatch.targets.sglang.wheel_fetch import check_version
from kvwatch.targets.sglang.workloads import Workload

if TYPE_CHECKING:
    from kvwatch.targets.sglang.release_import import Release

CACHES = ("radix", "mamba", "swa")


class CacheProfile(NamedTuple):
    """A profile of this target: one of the workloads."""

    name: str
    summary: str
    workload: type[Workload]
    turns: int = 6


WORKLOADS = {**workloads.WORKLOADS, **scheduler_workloads.WORKLOADS}
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
        self.left_out: dict[str, str] = {}  # profile -> why its driver cannot run it

    def profiles(self) -> Mapping[str, CacheProfile]:
        return PROFILES

    def workload(self, profile: CacheProfile, c: int = 1, seed: int = 0) -> Workload:
        """``profile``'s workload for this target's cache and release."""
        return profile.workload(c=c, seed=seed, page_size=self.page_size, cache=self.cache)

    def _load(self, progress: Progress | None) -> Release | None:
        """The release, loaded on first use (None, and ``unavailable`` set, when it
        cannot be had or nothing drives it)."""
        from kvwatch.targets.sglang.loop_choice import Unsupported, load
        from kvwatch.targets.sglang.wheel_fetch import Unavailable

        say = progress.say if progress is not None else (lambda line: None)
        if self.release is None and self.unavailable is None:
            say(f"loading sglang {self.version}'s scheduler and caches from its wheel")
            try:
                self.release = load(self.version, self.wheel_cache)
            except (Unavailable, Unsupported) as exc:
                self.unavailable = str(exc)
                return None
            if progress is not None:
                say(f"sglang {self.version}: driven by its own Scheduler")
        return self.release

    def refusal(self, profile: CacheProfile) -> str | None:
        """Why the loaded release's driver cannot run ``profile`` here, or None."""
        from kvwatch.targets.sglang.loop_choice import Unsupported, check

        try:
            check(self.release, self.workload(profile).config())
        except Unsupported as exc:
            return str(exc)
        return None

    def selected(self, names: Sequence[str]) -> tuple[CacheProfile, ...]:
        """The profiles asked for by name; with none named, every profile the
        release's driver runs here (``started`` says which are left out and why)."""
        chosen = super().selected(names)
        if names or self._load(None) is None:
            return chosen
        self.left_out = {p.name: why for p in chosen if (why := self.refusal(p))}
        return tuple(p for p in chosen if p.name not in self.left_out) or chosen

    @contextlib.contextmanager
    def started(self, progress: Progress) -> Iterator[None]:
        if self.release is not None:
            progress.say(f"sglang {self.version}: driven by its own Scheduler")
        for name, why in self.left_out.items():
            progress.say(f"leaving out the {name} profile: {why}")
        yield

    def loaded(self, profile: CacheProfile, progress: Progress) -> Release:
        """The release, loaded on first use; ServerError when it cannot be had, or
        nothing drives ``profile`` on it with its ``--sglang-cache``."""
        release = self._load(progress)
        if release is None:  # tried once for the gate: not again per profile
            raise ServerError(self.unavailable)
        if (why := self.refusal(profile)) is not None:
            raise ServerError(why)
        return release

    @contextlib.contextmanager
    def serving(self, profile: CacheProfile, progress: Progress) -> Iterator[Served]:
        yield SglangServed(self, profile, self.loaded(profile, progress))


class SglangServed(Served):
    def __init__(self, target: SglangCacheTarget, profile: CacheProfile, release: Release) -> None:
        self.target, self.profile, self.release = target, profile, release

    def run(self, spec: RunSpec) -> RunRecord:
        from kvwatch.targets.sglang.recording import record_run

        workload = self.target.workload(self.profile, c=spec.concurrency, seed=spec.seed)
        return record_run(
            self.release, workload, turns=spec.turns, warmup=spec.warmup, say=spec.progress.say
        )
