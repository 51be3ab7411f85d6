"""Which detector must catch each planted fault, and on which profile.

For every fault in the engine's registry (``kvwatch.engine.faults``) that a
gate profile reaches, ``CATCHES`` names the load profile whose conversations take the fault's code
path and the detector that must fail the gate on it: the gate's promise that
``kvwatch gate --profile P --inject F`` exits 1 with detector D failed. The
mutation matrix (``mutation/matrix.py``) runs exactly these rows through
``kvwatch gate``; ``kvwatch faults`` prints them and ``kvwatch profiles`` the
faults each profile exposes. The profiles themselves (``harness/profiles.py``)
know no detector. Importing this module loads nothing else.
"""

from __future__ import annotations

from typing import NamedTuple


class Catch(NamedTuple):
    profile: str  # the profile whose conversations take the fault's code path
    detector: str  # the detector that must fail the gate on it


# Every fault in the engine's registry, the profile that reaches it and the
# detector that must catch it: the mutation matrix's rows.
CATCHES: dict[str, Catch] = {
    "interior-snapshot-leak": Catch("agentic-trie", "allocator"),
    "snapshot-release-ignores-host-refs": Catch("agentic-trie", "tree"),
    "history-only-anchor": Catch("agentic-trie", "tree"),
    "root-ref-leak-on-miss": Catch("agentic-trie", "refcount"),
    "root-in-evict-set": Catch("abort-storm", "tree"),
    "abort-state-buffer-leak": Catch("abort-storm", "allocator"),
    "spec-overalloc-leak": Catch("streaming-session", "allocator"),
    "session-tail-leak": Catch("streaming-session", "allocator"),
    "session-tail-unaligned-free": Catch("streaming-session", "allocator"),
    "session-blob-retention": Catch("rl-rollout", "heap"),
    "stale-slot-entry": Catch("slot-cache", "slot-table"),
}

HISTORY_TIER = "histories"  # ``kvwatch histories``: generated histories, in process
# The faults only the history tier reaches: a conversation or a cache hit gone wrong
# without a page leaked, which no gate detector reads. The "detector" is the
# history check (``histories/checks.py``) that must fail on it.
HISTORY_CATCHES: dict[str, Catch] = {
    "session-keeps-unrun-turn": Catch(HISTORY_TIER, "content"),
    "prefix-match-first-page-only": Catch(HISTORY_TIER, "content"),
    "evict-parent-unannounced": Catch(HISTORY_TIER, "index"),
    "aborted-holder-parked": Catch(HISTORY_TIER, "references"),
}


def catch_of(fault: str) -> Catch:
    """What reaches ``fault`` and what must catch it: a gate row or the history tier."""
    return CATCHES[fault] if fault in CATCHES else HISTORY_CATCHES[fault]


def exposed_by(profile: str) -> tuple[str, ...]:
    """The faults ``profile`` is there to expose, in ``CATCHES`` order."""
    return tuple(fault for fault, catch in CATCHES.items() if catch.profile == profile)
