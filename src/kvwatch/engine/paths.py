"""Path keys: a cheap name for the part of the tree a prompt or a node lies in.

Two token sequences are *on the same path* when they share their first full
page (and extra key): they then descend into the same child of the root, so
one's retraction, recovery or eviction can touch what the other matches or
commits. ``path_key`` names that first page with a stable 63-bit digest; a
sequence shorter than a page has no path (key 0). ``prompt_key`` digests a
whole prompt, so listeners can tell two prompts apart without their tokens.

The key is coarse on purpose: every conversation that starts with the same
system prompt shares one. It costs one digest of a page per request and per
evicted node, and needs no tree walk.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

NO_PATH = 0


def _digest(tokens: Sequence[int], extra_key: str | None) -> int:
    h = hashlib.blake2b(digest_size=8)
    h.update((extra_key or "").encode("utf-8", "surrogatepass") + b"\0")
    h.update(array("q", tokens).tobytes())
    return (int.from_bytes(h.digest(), "big") >> 1) or 1  # never NO_PATH


def path_key(tokens: Sequence[int], extra_key: str | None, page_size: int) -> int:
    """The key of the first full page of ``tokens`` (with ``extra_key``); ``NO_PATH``
    when there is no full page. Equal keys: the same child of the root."""
    if len(tokens) < page_size:
        return NO_PATH
    return _digest(tokens[:page_size], extra_key)


def prompt_key(tokens: Sequence[int], extra_key: str | None) -> int:
    """A digest of the whole sequence: equal prompts have equal keys."""
    return _digest(tokens, extra_key)


def key_base(extra_key: str | None) -> int:
    """The key a sequence's first block chains from: its extra key's digest."""
    return _digest((), extra_key)


def block_keys(prev: int, tokens: Sequence[int], page_size: int) -> tuple[int, ...]:
    """The block key of each full page of ``tokens``, chained from ``prev``: a page's key
    names every token up to its end, so two pages share a key only on the same prefix."""
    keys = []
    for at in range(0, len(tokens) - page_size + 1, page_size):
        h = hashlib.blake2b(digest_size=8)
        h.update(prev.to_bytes(8, "big"))
        h.update(array("q", tokens[at : at + page_size]).tobytes())
        prev = (int.from_bytes(h.digest(), "big") >> 1) or 1
        keys.append(prev)
    return tuple(keys)
