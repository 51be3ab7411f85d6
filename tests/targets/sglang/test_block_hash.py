"""The CPU stand-in for SGLang's page hash extension: each page SHA-256 over the previous
page's digest and its tokens as little-endian 32-bit words, computed here byte by byte."""

from __future__ import annotations

import hashlib

import pytest

from kvwatch.targets.sglang.block_hash import EXTENSION, get_hash, loader_module


def _le(*tokens: int) -> bytes:
    return b"".join(t.to_bytes(4, "little") for t in tokens)


def test_pages_chain_their_digests_and_a_last_short_page_counts():
    first = hashlib.sha256(_le(7, 8)).digest()
    second = hashlib.sha256(first + _le(9)).digest()
    assert get_hash([7, 8, 9], 3, 1, False, None, 2) == [first.hex(), second.hex()]
    prior = b"\x01" * 32
    assert get_hash([7, 8], 2, 1, False, prior, 2) == [
        hashlib.sha256(prior + _le(7, 8)).hexdigest()
    ]


def test_without_a_page_size_one_digest_of_the_whole_key():
    assert get_hash([7, 8, 9], 3, 1, False, None) == hashlib.sha256(_le(7, 8, 9)).hexdigest()


def test_what_it_does_not_know_raises_and_only_the_hash_extension_loads():
    with pytest.raises(NotImplementedError):
        get_hash([1, 2], 2, 1, True, None, 1)  # bigram keys
    with pytest.raises(NotImplementedError):
        get_hash([2**40], 1, 1, False, None, 1)
    loader = loader_module("sglang.srt.utils.cpp_extension_loader")
    assert loader.load_extension_with_recovery(name=EXTENSION).get_hash is get_hash
    with pytest.raises(RuntimeError):
        loader.load_extension_with_recovery(name="another_ext")
