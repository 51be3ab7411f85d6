"""Which releases SGLang's own ``Scheduler`` is driven on here, and what it refuses (and why).

Decided by the release's own files, never by its version number. The
loop is always ``SchedulerLoop`` (``loop.py``), the release's
``Scheduler`` built by its own ``__init__`` and stepped one iteration of its
own event loop at a time; how it is built depends on where the scheduler
reads its settings:

* from the ``ServerArgs`` dataclass (0.5.4.post3 .. 0.5.13.post1):
  ``scheduler_imports.PLAN``, the settings given to ``ServerArgs``;
* from ``sglang.srt.runtime_context`` (0.5.16+): ``runtime_host.PLAN``, the
  settings made the process's configuration by the release's own code, the
  way its scheduler process does (``runtime_host.server_args``).

``check`` refuses, with the reason, a run a release cannot make: an SWA
cache before the release's registry and SWA pool base (0.5.13.post1),
streaming sessions before its session cache (0.5.10rc0), a mamba cache
without ``MambaRadixCache``.

Invariant: a release is loaded with the imports its scheduler needs
(``load``), and ``make`` returns the release's own scheduler as an
``EngineLoop`` (``loop.SchedulerLoop``).
"""

from __future__ import annotations

from pathlib import Path

from kvwatch.targets.sglang import loop, release_import, runtime_host, scheduler_imports
from kvwatch.targets.sglang.loop_parts import LoopConfig
from kvwatch.targets.sglang.release_import import Release
from kvwatch.targets.sglang.wheel_fetch import fetch


class Unsupported(RuntimeError):
    """Nothing drives this release (or this run on it) here."""


def plan_for(root: Path) -> release_import.ImportPlan:
    """The imports the release extracted at ``root`` needs; ``Unsupported`` for a
    release whose scheduler the host does not build."""
    scheduler = root / "sglang" / "srt" / "managers" / "scheduler.py"
    if not scheduler.is_file():
        raise Unsupported(f"sglang at {root.parent.name}: it has no managers/scheduler.py")
    return runtime_host.PLAN if runtime_host.applies(root) else scheduler_imports.PLAN


def load(version: str, cache: Path | None = None) -> Release:
    """The release with the imports its scheduler needs (``Unsupported``: not driven)."""
    return release_import.load(version, cache, plan_for(fetch(version, cache)))


def check(release: Release, config: LoopConfig) -> None:
    """``Unsupported`` unless the release's scheduler runs ``config`` here."""
    why = None
    if config.pools.swa_tokens is not None and not _swa(release):
        why = "it has no SWA allocator over a BaseSWAKVPool to build (0.5.13.post1+)"
    elif config.streaming and not release.has("session_cache"):
        why = "it has no streaming-session cache (0.5.10rc0+)"
    elif config.pools.mamba_slots is not None and not _mamba(release):
        why = "it has no MambaRadixCache"
    if why is not None:
        raise Unsupported(f"sglang {release.version}: {why}")


def _registry(release: Release) -> bool:
    return release.has("registry") and hasattr(release.module("registry"), "create_tree_cache")


def _swa(release: Release) -> bool:
    return _registry(release) and release.has("swa_allocator") and release.has("swa_kv_pool")


def _mamba(release: Release) -> bool:
    return _registry(release) or release.has("mamba_radix")


def environment(release: Release, config: LoopConfig) -> dict[str, str]:
    """What SGLang reads from the environment for this run."""
    runtime = runtime_host.ENVIRONMENT if release.plan is runtime_host.PLAN else {}
    return {**loop.environment(config), **runtime}


def make(release: Release, config: LoopConfig, seed: int = 0) -> loop.SchedulerLoop:
    """The release's own scheduler over fresh pools and cache (call while it is active)."""
    return loop.SchedulerLoop(release, config, seed=seed)
