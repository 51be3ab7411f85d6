"""Which detector must catch each planted fault, and on which profile.

For every fault in the engine's registry (``kvwatch.engine.faults``),
``CATCHES`` names the load profile whose conversations take the fault's code
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


def exposed_by(profile: str) -> tuple[str, ...]:
    """The faults ``profile`` is there to expose, in ``CATCHES`` order."""
    return tuple(fault for fault, catch in CATCHES.items() if catch.profile == profile)
