"""What steps a release's scheduling: its own ``Scheduler``, a shim, or nothing (and why).

Decided by the release's own files, never by its version number:

* ``OwnScheduler`` (``own_scheduler.py``): the release's ``Scheduler`` built
  and stepped as it ships, for releases whose scheduler reads its settings
  from the ``ServerArgs`` dataclass (0.5.4.post3 .. 0.5.13.post1);
* ``CheckpointScheduler`` (``checkpoint_shim.py``): releases whose scheduler
  reads ``sglang.srt.runtime_context`` (0.5.16+: msgspec argument groups,
  about forty ``init_*`` steps over ``scheduler_components``, not built on a
  CPU host yet) and whose ``mem_cache/common.py`` has
  ``checkpoint_kv_cache`` (0.5.22, 0.5.23): kvwatch plays their event loop;
* 0.5.16 .. 0.5.21 (``runtime_context`` but no checkpoint API) are refused
  with the reason (``Unsupported``), and so is what a driver cannot run
  (``check``): speculative decoding under the own scheduler (no draft worker
  stand-in), priority scheduling under the shim (it models none), an SWA
  cache before the release's registry and SWA pool base (0.5.13.post1),
  streaming sessions before the release's session cache (0.5.10rc0).

Invariant: a release is loaded with the imports its driver needs
(``load``: ``scheduler_imports.PLAN`` for the own scheduler), and ``make``
returns the driver ``drives`` names for it.
"""

from __future__ import annotations

from pathlib import Path

from kvwatch.targets.sglang import own_scheduler, release_import, scheduler_imports
from kvwatch.targets.sglang.checkpoint_shim import CheckpointScheduler
from kvwatch.targets.sglang.release_import import Release
from kvwatch.targets.sglang.scheduler_traits import SNIPPETS, first_line
from kvwatch.targets.sglang.shim_parts import ShimConfig, ShimLoop
from kvwatch.targets.sglang.wheel_fetch import fetch

OWN, SHIM = "own", "shim"
RUNTIME_CONTEXT = "from sglang.srt.runtime_context import"  # 0.5.16+: in scheduler.py


class Unsupported(RuntimeError):
    """Nothing drives this release (or this run on it) here."""


def drives(root: Path) -> str:
    """``OWN`` or ``SHIM`` for the release extracted at ``root``; ``Unsupported``
    for a release neither drives."""
    srt = root / "sglang" / "srt"
    if first_line(srt / "managers" / "scheduler.py", (RUNTIME_CONTEXT,)) is None:
        return OWN
    file, snippet = SNIPPETS["checkpoint_api"]
    if first_line(srt / file, (snippet,)) is not None:
        return SHIM
    raise Unsupported(
        f"sglang at {root.parent.name}: its scheduler reads runtime_context (0.5.16+), "
        "which is not built on a CPU host here, and it has no checkpoint_kv_cache "
        "(the 0.5.16-0.5.21 scheduler), which no shim models; kvwatch drives "
        "0.5.4.post3-0.5.13.post1 with SGLang's own scheduler and 0.5.22+ with a shim"
    )


def load(version: str, cache: Path | None = None) -> Release:
    """The release with the imports its driver needs (``Unsupported``: none drives it)."""
    driver = drives(fetch(version, cache))
    plan = scheduler_imports.PLAN if driver == OWN else release_import.CACHES_ONLY
    return release_import.load(version, cache, plan)


def driver_of(release: Release) -> str:
    return OWN if release.plan is scheduler_imports.PLAN else SHIM


def check(release: Release, config: ShimConfig) -> None:
    """``Unsupported`` unless the release's driver runs ``config`` here."""
    if driver_of(release) == OWN:
        why = own_scheduler.refusal(config)
    elif config.priority_scheduling or config.max_queued_requests is not None:
        why = "the shim models no priority scheduling or queued-requests limit"
    else:
        why = None
    if why is None and config.pools.swa_tokens is not None and not _swa(release):
        why = "it has no SWA allocator over a BaseSWAKVPool to build (0.5.13.post1+)"
    if why is None and config.streaming and not release.has("session_cache"):
        why = "it has no streaming-session cache (0.5.10rc0+)"
    if why is None and config.pools.mamba_slots is not None and not _mamba(release):
        why = "it has no MambaRadixCache"
    if why is not None:
        raise Unsupported(f"sglang {release.version}: {why}")


def _registry(release: Release) -> bool:
    return release.has("registry") and hasattr(release.module("registry"), "create_tree_cache")


def _swa(release: Release) -> bool:
    return _registry(release) and release.has("swa_allocator") and release.has("swa_kv_pool")


def _mamba(release: Release) -> bool:
    return _registry(release) or release.has("mamba_radix")


def environment(release: Release, config: ShimConfig) -> dict[str, str]:
    """What SGLang reads from the environment for this run."""
    return own_scheduler.environment(config) if driver_of(release) == OWN else {}


def make(release: Release, config: ShimConfig, seed: int = 0) -> ShimLoop:
    """The driver for ``release`` over fresh pools and cache (call while it is active)."""
    if driver_of(release) == OWN:
        return own_scheduler.OwnScheduler(release, config, seed=seed)
    if drives(release.root) != SHIM:
        raise Unsupported(
            f"sglang {release.version} runs its own Scheduler (shim_choice.load): no shim plays it"
        )
    return CheckpointScheduler(release, config, seed=seed)
