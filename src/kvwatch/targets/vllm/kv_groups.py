"""A ``kv_layout.Layout`` as vLLM's own objects, in vLLM's Python (the driver's side).

vLLM's engine core builds its scheduler from a ``KVCacheConfig`` whose
groups the model's layers make, then resolves two sizes with
``kv_cache_utils.resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)``:
the scheduler's block size (the LCM of the groups') and the hash block size
(``cache_config.prefix_match_unit`` if set, else the GCD), which it passes to
``Scheduler(block_size=..., hash_block_size=...)`` and to the request block
hasher. The driver does the same with no model:

- ``group_specs``: one ``KVCacheGroupSpec`` per group, each of one layer:
  ``FullAttentionSpec``, ``SlidingWindowSpec(sliding_window=window)``,
  ``MambaSpec(mamba_cache_mode="align")`` (one small state: the scheduler
  never reads its shape);
- ``configure``: ``cache_config.prefix_match_unit``, ``mamba_cache_mode``
  (``align``, as ``MambaModelConfig`` sets it when prefix caching is on) and
  ``kv_events_config`` (``enable_kv_cache_events``, publisher ``null``: the
  driver takes each ``KVEventBatch`` itself, ``event_ledger.py``);
- ``block_sizes``: vLLM's own resolution, which also rejects what vLLM
  rejects (a unit finer than the block with one group).

A release without a knob the layout needs raises ``Unsupported`` with the
reason; nothing is emulated.
"""

from __future__ import annotations

import inspect

from kvwatch.targets.vllm.kv_layout import Layout


class Unsupported(ValueError):
    """The release has no way to build this layout (its reason is the message)."""


def accepted(cls, **wanted) -> dict:
    """The keyword arguments ``cls`` takes (they differ between releases)."""
    params = inspect.signature(cls).parameters
    return {k: v for k, v in wanted.items() if k in params}


def group_specs(layout: Layout) -> list:
    """vLLM's ``KVCacheGroupSpec`` for each group of ``layout``, one layer each."""
    import torch
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheGroupSpec,
        MambaSpec,
        SlidingWindowSpec,
    )

    shape = {
        "block_size": layout.block_size,
        "num_kv_heads": 1,
        "head_size": 8,
        "dtype": torch.float32,
    }
    made = {
        "full": lambda: FullAttentionSpec(**shape),
        "swa": lambda: SlidingWindowSpec(**shape, sliding_window=layout.window),
        "mamba": lambda: MambaSpec(
            **accepted(
                MambaSpec,
                block_size=layout.block_size,
                shapes=((4,),),
                dtypes=(torch.float32,),
                mamba_cache_mode="align",
            )
        ),
    }
    return [
        KVCacheGroupSpec([f"layers.{i}.{kind}"], made[kind]())
        for i, kind in enumerate(layout.groups)
    ]


def configure(config, layout: Layout) -> None:
    """Set the layout's knobs on vLLM's config, where the release has them."""
    cache = config.cache_config
    if layout.prefix_match_unit is not None:
        if not hasattr(cache, "prefix_match_unit"):
            raise Unsupported("this vLLM's CacheConfig has no prefix_match_unit (0.26.0+)")
        cache.prefix_match_unit = layout.prefix_match_unit
    if "mamba" in layout.groups:
        if not hasattr(cache, "mamba_cache_mode"):
            raise Unsupported("this vLLM's CacheConfig has no mamba_cache_mode")
        cache.mamba_cache_mode = "align"
    if layout.events:
        from vllm.config import KVEventsConfig

        config.kv_events_config = KVEventsConfig(
            **accepted(KVEventsConfig, enable_kv_cache_events=True, publisher="null")
        )


def kv_cache_config(layout: Layout, num_blocks: int):
    """vLLM's ``KVCacheConfig``: ``num_blocks`` blocks shared by every group."""
    from vllm.v1.kv_cache_interface import KVCacheConfig

    return KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=group_specs(layout)
    )


def block_sizes(kv, config, layout: Layout) -> tuple[int, int]:
    """(scheduler block size, hash block size) as the engine core resolves them."""
    try:
        from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes
    except ImportError:
        if layout.hybrid or layout.prefix_match_unit:
            raise Unsupported("this vLLM resolves no hash block size") from None
        return layout.block_size, layout.block_size
    try:
        return resolve_kv_cache_block_sizes(kv, config)
    except ValueError as exc:
        raise Unsupported(f"vLLM rejects layout {layout.label}: {exc}") from None
