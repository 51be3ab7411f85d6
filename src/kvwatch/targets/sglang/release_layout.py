"""Where each release keeps the pieces the target drives: the one place module layouts differ.

SGLang moved modules between releases (the streaming-session cache went from
``mem_cache/session_aware_cache.py`` to ``session/streaming_session.py`` in
0.5.11; the allocator became a package). Each *role* lists the module paths
it has had, newest first, and a release's layout is the first of them its
wheel has (``resolve``). ``REAL`` names the modules imported from the wheel
unchanged (a module, or a package and everything under it); every other
``sglang`` module is a stub, and so are the GPU and server packages in
``STUBBED_PACKAGES`` (``release_import.py``).

Invariant: this is data only; the release's own files decide which entry
applies.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

# role -> (module, class or None), the candidates newest first
ROLES: dict[str, tuple[tuple[str, str | None], ...]] = {
    "base": (("sglang.srt.mem_cache.base_prefix_cache", "BasePrefixCache"),),
    "radix": (("sglang.srt.mem_cache.radix_cache", "RadixCache"),),
    "mamba_radix": (("sglang.srt.mem_cache.mamba_radix_cache", "MambaRadixCache"),),
    "session_cache": (
        ("sglang.srt.session.streaming_session", "StreamingSession"),
        ("sglang.srt.mem_cache.session_aware_cache", "SessionAwareCache"),
    ),
    "session_controller": (
        ("sglang.srt.session.session_controller", "SessionController"),
        ("sglang.srt.managers.session_controller", "SessionController"),
    ),
    "common": (("sglang.srt.mem_cache.common", None),),
    "allocator": (("sglang.srt.mem_cache.allocator", None),),
    "memory_pool": (("sglang.srt.mem_cache.memory_pool", None),),
    "cache_init_params": (("sglang.srt.mem_cache.cache_init_params", "CacheInitParams"),),
    "schedule_batch": (("sglang.srt.managers.schedule_batch", None),),
    "schedule_policy": (("sglang.srt.managers.schedule_policy", None),),
    "manager_utils": (("sglang.srt.managers.utils", None),),
    # 0.5.13+: the scheduler picks (and wraps) its tree cache through a registry
    "registry": (("sglang.srt.mem_cache.registry", None),),
    # 0.5.12+: one tree over FULL / SWA / MAMBA components (0.5.22+: every model's cache)
    "unified_radix": (("sglang.srt.mem_cache.unified_radix_cache", "UnifiedRadixCache"),),
    "swa_radix": (("sglang.srt.mem_cache.swa_radix_cache", "SWARadixCache"),),
    # 0.5.16+: alloc_for_extend / alloc_for_decode moved out of common.py
    "allocation": (
        ("sglang.srt.mem_cache.allocation", None),
        ("sglang.srt.mem_cache.common", None),
    ),
    "allocation_sizing": (("sglang.srt.mem_cache.allocation_sizing", None),),
    "swa_allocator": (
        ("sglang.srt.mem_cache.allocator.swa", "SWATokenToKVPoolAllocator"),
        ("sglang.srt.mem_cache.swa_memory_pool", "SWATokenToKVPoolAllocator"),
    ),
    "swa_kv_pool": (("sglang.srt.mem_cache.base_swa_memory_pool", "BaseSWAKVPool"),),
}
REQUIRED = ("base", "radix", "common", "allocator", "memory_pool", "schedule_batch")

REAL = (
    "sglang.srt.mem_cache.base_prefix_cache",
    "sglang.srt.mem_cache.radix_cache",
    "sglang.srt.mem_cache.swa_radix_cache",
    "sglang.srt.mem_cache.mamba_radix_cache",
    "sglang.srt.mem_cache.session_aware_cache",
    "sglang.srt.mem_cache.common",
    "sglang.srt.mem_cache.allocator",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.swa_memory_pool",
    "sglang.srt.mem_cache.chunk_cache",
    "sglang.srt.mem_cache.evict_policy",
    "sglang.srt.mem_cache.cache_init_params",
    "sglang.srt.mem_cache.utils",
    "sglang.srt.mem_cache.events",
    # the KV events' records, and the page hash they name blocks by (0.5.2x; its C++
    # loader is block_hash.py's)
    "sglang.srt.disaggregation.kv_events",
    "sglang.srt.mem_cache.cpp_utils.native_hash",
    "sglang.srt.mem_cache.unified_cache",
    # the paged allocator's triton kernels (launches run kv_pools' stand-ins): 0.5.13 ..
    # 0.5.19 in mem_cache, 0.5.20+ in sglang.kernels (0.5.22+ use them on CUDA only)
    "sglang.srt.mem_cache.triton_ops",
    "sglang.kernels.ops.memory.allocator",
    "sglang.srt.mem_cache.unified_cache_components",
    "sglang.srt.mem_cache.unified_radix_cache",
    "sglang.srt.mem_cache.registry",
    "sglang.srt.mem_cache.allocation",
    "sglang.srt.mem_cache.allocation_sizing",
    "sglang.srt.mem_cache.prefill_budget",
    "sglang.srt.mem_cache.base_swa_memory_pool",
    "sglang.srt.mem_cache.pure_swa_radix_cache",
    "sglang.srt.mem_cache.session_radix_cache",
    # built by HybridReqToTokenPool: a stub there is a truthy "checkpoint pool"
    "sglang.srt.mem_cache.mamba_checkpoint_pool",
    "sglang.srt.mem_cache.ple_state_pool",
    "sglang.srt.session",
    "sglang.srt.managers.schedule_batch",
    "sglang.srt.managers.schedule_policy",
    "sglang.srt.managers.session_controller",
    "sglang.srt.managers.utils",
    # 0.5.22+: the new-token ratio after a retraction (a stub made it 0: over-admission)
    "sglang.srt.managers.scheduler_components.new_token_ratio_tracker",
    # 0.5.22+: SGLang's own invariant checks (SGLANG_INVARIANT_CHECK=2 makes them raise)
    "sglang.srt.utils.invariants",
    "sglang.srt.environ",
    # ForwardMode / CaptureHiddenMode: real enums (0.5.22+ compares them)
    "sglang.srt.model_executor.forward_batch_info",
    # beam search's batch-tail helpers sit in retract/filter/merge (0.5.22+); a stub
    # there drops requests (beam_retraction_order answering a falsy stub)
    "sglang.srt.beam_search",
)
# GPU packages (and server-only ones) SGLang's modules import at the top: stubs on a CPU host
STUBBED_PACKAGES = (
    "sgl_kernel",
    "flashinfer",
    "deep_gemm",
    "cuda",
    "torchvision",
    "orjson",
    "pybase64",
    "huggingface_hub",
)


class Role(NamedTuple):
    module: str
    cls: str | None


def is_real(name: str) -> bool:
    return any(name == r or name.startswith(r + ".") for r in REAL)


def module_file(root: Path, name: str) -> Path | None:
    """The source of module ``name`` under the extracted wheel ``root``, if any."""
    base = root / name.replace(".", "/")
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def resolve(root: Path) -> dict[str, Role]:
    """Each role's module in the release extracted at ``root`` (absent roles left out);
    LookupError when a required one is missing."""
    found = {}
    for role, candidates in ROLES.items():
        for module, cls in candidates:
            if module_file(root, module) is not None:
                found[role] = Role(module, cls)
                break
    missing = [r for r in REQUIRED if r not in found]
    if missing:
        raise LookupError(f"the wheel at {root} has no module for {', '.join(missing)}")
    return found
