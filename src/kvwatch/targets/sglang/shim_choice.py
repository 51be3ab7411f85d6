"""Which shim plays a release's scheduler, decided by the release's own code (``scheduler_traits``).

* ``LegacyScheduler`` (``legacy_shim.py``): 0.5.4.post3 .. 0.5.13.post1, whose
  requests lock ``last_node`` and are released with ``cache_finished_req`` or
  ``release_kv_cache(is_insert=...)``;
* ``CheckpointScheduler`` (``checkpoint_shim.py``): releases whose
  ``mem_cache/common.py`` has ``checkpoint_kv_cache`` (0.5.22, 0.5.23).

Releases between (0.5.16 .. 0.5.20: a ``ReqKvInfo`` but no checkpoint API)
are refused with the reason (``Unsupported``) rather than driven by the wrong
shim, and so is a cache or a streaming session a release cannot build
(``check``): the ``swa`` cache needs the release's registry to build it
(0.5.13.post1+), streaming sessions need its session cache (0.5.10+).
"""

from __future__ import annotations

from kvwatch.targets.sglang import scheduler_traits
from kvwatch.targets.sglang.checkpoint_shim import CheckpointScheduler
from kvwatch.targets.sglang.legacy_shim import LegacyScheduler
from kvwatch.targets.sglang.release_import import Release
from kvwatch.targets.sglang.shim_parts import ShimConfig, ShimLoop


class Unsupported(RuntimeError):
    """No shim models this release's scheduler."""


def shim_class(release: Release) -> type[LegacyScheduler] | type[CheckpointScheduler]:
    """The shim for ``release``; ``Unsupported`` when neither models it."""
    traits = scheduler_traits.read(release.root)
    if traits.checkpoint_api:
        return CheckpointScheduler
    if traits.kv_info:
        raise Unsupported(
            f"sglang {release.version} keeps a ReqKvInfo without checkpoint_kv_cache (the "
            "0.5.16-0.5.20 scheduler), which no shim models; it drives 0.5.4.post3-0.5.13.post1 "
            "and 0.5.22+"
        )
    return LegacyScheduler


def check(release: Release, *, cache: str, sessions: bool = False) -> None:
    """``Unsupported`` unless a shim drives ``release`` with ``cache`` (radix, mamba or
    swa) and, when ``sessions``, its streaming sessions."""
    shim_class(release)
    registry = release.has("registry") and hasattr(release.module("registry"), "create_tree_cache")
    if cache == "swa" and not registry:
        raise Unsupported(
            f"sglang {release.version} has no registry to build its SWA cache from "
            "(mem_cache/registry.py create_tree_cache: 0.5.13.post1+)"
        )
    if cache == "mamba" and not (registry or release.has("mamba_radix")):
        raise Unsupported(f"sglang {release.version} has no MambaRadixCache")
    if sessions and not release.has("session_cache"):
        raise Unsupported(f"sglang {release.version} has no streaming-session cache (0.5.10+)")


def make(release: Release, config: ShimConfig, seed: int = 0) -> ShimLoop:
    """A shim for ``release`` over fresh pools and cache (call while it is active)."""
    return shim_class(release)(release, config, seed=seed)
