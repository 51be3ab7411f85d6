"""What a vLLM request's tokens make: its block hashes and prefix digests.

``recomputed_hashes`` runs the request's own hasher over its whole chain from
token 0 (so cache salt, LoRA and multimodal keys count as vLLM counts them);
``prefix_digests`` chains a digest of each full hash unit's prefix, in linear
time, so two holders of one block compare prefixes without comparing tokens;
``unit_of`` and ``covered`` say how many tokens a hash and a block's hash
cover when hashes are finer than blocks. Only reads, and imports nothing
from vLLM.
"""

from __future__ import annotations

import hashlib

from kvwatch.targets.vllm.scheduler_reads import hash_block_size


class _Unhashed:
    """A request seen with no block hashes yet: its own hasher, called on this,
    computes the whole chain from token 0."""

    def __init__(self, request) -> None:
        object.__setattr__(self, "_request", request)
        object.__setattr__(self, "block_hashes", [])

    def __getattr__(self, name):
        return getattr(object.__getattribute__(self, "_request"), name)


def recomputed_hashes(request) -> list | None:
    """The block hashes ``request``'s tokens make, or None without a hasher (no prefix caching)."""
    hasher = getattr(request, "_block_hasher", None)
    return None if hasher is None else list(hasher(_Unhashed(request)))


def prefix_digests(tokens: list[int], size: int) -> list[str]:
    """A digest of ``tokens[: (i + 1) * size]`` for each full block i, chained (linear time)."""
    out, last = [], b""
    for end in range(size, len(tokens) + 1, size):
        last = hashlib.blake2b(last + repr(tokens[end - size : end]).encode(), digest_size=10)
        last = last.digest()
        out.append(last.hex())
    return out


def unit_of(scheduler, manager) -> int:
    """Tokens per prefix hash for ``manager``'s group: the hash block size, which divides
    the group's block size (one hash per block when they are equal)."""
    unit = hash_block_size(scheduler) or manager.block_size
    return unit if unit > 0 and manager.block_size % unit == 0 else manager.block_size


def covered(block, index: int, block_size: int) -> int:
    """Tokens of its request's prefix that ``block``'s hash covers: vLLM's
    ``block_hash_num_tokens`` (a partial-block entry covers fewer than the block's
    end), else the end of block ``index``."""
    n = getattr(block, "block_hash_num_tokens", None)
    return n if isinstance(n, int) and n > 0 else (index + 1) * block_size
