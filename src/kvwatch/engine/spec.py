"""Speculative drafts by n-gram prompt lookup.

The longest suffix n-gram of the sequence (``max_ngram`` down to
``min_ngram`` tokens) is searched for earlier in the sequence, most recent
occurrence first; the tokens that followed it are the drafts.
"""

from __future__ import annotations

LOOKBACK = 2048  # only the most recent tokens are searched, so a step stays cheap


def propose(tokens: list[int], k: int, min_ngram: int, max_ngram: int) -> tuple[int, ...]:
    if k <= 0:
        return ()
    window = tokens[-LOOKBACK:]
    end = len(window)
    for n in range(max_ngram, min_ngram - 1, -1):
        if end <= n:
            continue
        suffix = window[end - n :]
        for i in range(end - n - 1, -1, -1):
            if window[i : i + n] == suffix:
                return tuple(window[i + n : i + n + k])
    return ()
