"""The page hash SGLang's KV events name blocks by, on a CPU host.

SGLang 0.5.2x hashes each page of a radix key with a C++ extension
(``mem_cache/cpp_utils/native_hash.py`` loads ``hicache_hash_cpp`` through
``sglang.srt.utils.cpp_extension_loader``) whose source its wheel does not
ship, so a CPU host cannot build it. ``get_hash`` computes the same thing:
each page's tokens as little-endian 32-bit words, SHA-256 over the previous
page's digest (for the first page, the caller's prior digest, if any) and
those words; the hex digest of each page, or with no page size one digest of
the whole key. ``loader_module`` serves it where SGLang loads the extension.

Invariant: only the plain keys kvwatch's histories send are hashed (one unit
per token, ids below 2**32); anything else raises rather than guess.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from types import SimpleNamespace
from typing import Any

from kvwatch.targets.stand_ins import StubModule

EXTENSION = "hicache_hash_cpp"


def _digest(prior: bytes | None, words: list[int]) -> bytes:
    data = array("I", words)  # 4 bytes per token on the hosts SGLang supports
    if sys.byteorder != "little":
        data.byteswap()
    h = hashlib.sha256()
    if prior is not None:
        h.update(prior)
    h.update(data.tobytes())
    return h.digest()


def get_hash(
    raw_tokens: Any,
    logical_len: int,
    unit_width: int,
    is_bigram: bool,
    prior_digest: bytes | None = None,
    page_size: int | None = None,
) -> str | list[str]:
    if is_bigram or unit_width != 1:
        raise NotImplementedError("bigram and multi-unit keys have no CPU stand-in")
    words = [int(t) for t in raw_tokens[:logical_len]]
    if any(not 0 <= t < 2**32 for t in words):
        raise NotImplementedError("token ids beyond 32 bits have no CPU stand-in")
    if page_size is None:
        return _digest(prior_digest, words).hex()
    out, prior = [], prior_digest
    for at in range(0, logical_len, page_size):
        prior = _digest(prior, words[at : at + page_size])
        out.append(prior.hex())
    return out


def loader_module(module: str) -> StubModule:
    """``sglang.srt.utils.cpp_extension_loader``: the page hash, and no other extension."""

    def load_extension_with_recovery(name: str, **_: Any) -> SimpleNamespace:
        if name != EXTENSION:
            raise RuntimeError(f"the C++ extension {name} has no CPU stand-in")
        return SimpleNamespace(get_hash=get_hash)

    return StubModule(module, {"load_extension_with_recovery": load_extension_with_recovery})
