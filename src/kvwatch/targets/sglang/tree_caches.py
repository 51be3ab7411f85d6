"""SGLang's prefix caches, constructed the way the release's scheduler constructs them.

Two ways, chosen by what the release has (never by its version number):

* 0.5.13+ (``mem_cache/registry.py`` has ``create_tree_cache``): the release's
  own registry picks the cache from a ``TreeCacheBuildContext`` (``RadixCache``,
  ``MambaRadixCache`` / ``SWARadixCache``, or ``UnifiedRadixCache`` with FULL /
  SWA / MAMBA components, by release and by ``is_hybrid_ssm`` /
  ``is_hybrid_swa``) and wraps it in ``StreamingSession`` where the release
  does. We fill in the context: the pools, the page size, whether spec
  decoding is on, and the tree core ``"python"`` (the release's pure-Python
  ``UnifiedTreeCore``; the Rust core is a compiled extension not loaded here).
* before: ``RadixCache`` / ``MambaRadixCache`` built directly (keyword
  arguments before 0.5.10, a ``CacheInitParams`` after) and, for streaming
  sessions, wrapped in the release's session cache (``SessionAwareCache``
  until 0.5.10.post1, ``StreamingSession`` from 0.5.11), as
  ``Scheduler.init_cache_with_memory_pool`` does.

Invariant: every argument passed is one the release's constructor or
dataclass declares (``_offer`` filters by signature or fields).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from kvwatch.targets.sglang.host_modules import ServerArgsHolder
from kvwatch.targets.sglang.kv_pools import Pools
from kvwatch.targets.sglang.release_import import Release

TREE_CORE = "python"


def _offer(cls: type, **offered: Any) -> Any:
    """``cls(**offered)`` restricted to the fields or parameters ``cls`` declares."""
    if dataclasses.is_dataclass(cls):
        names = {f.name for f in dataclasses.fields(cls)}
    else:
        params = inspect.signature(cls.__init__).parameters
        if any(p.kind is p.VAR_KEYWORD for p in params.values()):
            return cls(**offered)
        names = set(params)
    return cls(**{k: v for k, v in offered.items() if k in names})


def _params(release: Release, pools: Pools, *, spec: bool) -> Any:
    return _offer(
        release.cls("cache_init_params"),
        disable=False,
        req_to_token_pool=pools.req_to_token_pool,
        token_to_kv_pool_allocator=pools.allocator,
        page_size=pools.config.page_size,
        is_eagle=spec,
        sliding_window_size=pools.config.sliding_window,
        tree_core_backend=TREE_CORE,
        enable_mamba_extra_buffer=False,
        enable_session_radix_cache=False,
    )


def _via_registry(release: Release, pools: Pools, *, streaming: bool, spec: bool) -> Any:
    registry = release.module("registry")
    args = ServerArgsHolder.current
    args.enable_streaming_session = streaming  # read by 0.5.13-0.5.20 create_tree_cache
    context = _offer(
        registry.TreeCacheBuildContext,
        server_args=args,
        params=_params(release, pools, spec=spec),
        is_hybrid_swa=pools.swa,
        is_hybrid_ssm=pools.mamba_pool is not None,
        enable_hierarchical_cache=False,
        disable_radix_cache=False,
        effective_chunked_prefill_size=None,
        tp_worker=None,
        model_config=None,
        tp_size=1,
        tp_rank=0,
        tp_group=None,
        full_tokens_per_layer=pools.config.kv_tokens if pools.swa else None,
        is_dsa=False,
    )
    return registry.create_tree_cache(context)


def _construct(release: Release, cls: type, pools: Pools) -> Any:
    offered = dict(
        req_to_token_pool=pools.req_to_token_pool,
        token_to_kv_pool_allocator=pools.allocator,
        page_size=pools.config.page_size,
        disable=False,
    )
    params = inspect.signature(cls.__init__).parameters
    if "params" in params and release.has("cache_init_params"):
        return cls(release.cls("cache_init_params")(**offered))
    return cls(**{k: v for k, v in offered.items() if k in params})


def build(release: Release, pools: Pools, *, streaming: bool, spec: bool = False) -> Any:
    """The tree cache the scheduler would use (call while the release is active)."""
    if release.has("registry") and hasattr(release.module("registry"), "create_tree_cache"):
        return _via_registry(release, pools, streaming=streaming, spec=spec)
    kind = "mamba_radix" if pools.mamba_pool is not None else "radix"
    cache = _construct(release, release.cls(kind), pools)
    if not streaming:
        return cache
    if not release.has("session_cache"):
        raise LookupError(f"sglang {release.version} has no streaming-session cache")
    supports = getattr(cache, "supports_streaming_session", None)
    if callable(supports) and supports() is True:
        return cache
    return release.cls("session_cache")(cache)


def inner(cache: Any) -> Any:
    """The tree cache under a session wrapper (the cache itself when unwrapped)."""
    return cache.__dict__.get("inner", cache)


def session_slots(cache: Any) -> dict[str, Any]:
    """The streaming-session slots by session id: the wrapper's (0.5.10-0.5.20) or,
    from 0.5.22, those of the ``StreamingSession`` the unified cache owns."""
    owned = getattr(inner(cache), "__dict__", {}).get("session")
    for holder in (cache, owned):
        slots = getattr(holder, "__dict__", {}).get("slots")
        if isinstance(slots, dict):
            return slots
    return {}
