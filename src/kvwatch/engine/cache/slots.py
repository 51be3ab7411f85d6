"""SlotTable: the bookkeeping of the snapshot-slot prefix cache (seed 004).

The ``slots`` backend keeps N whole-state snapshots instead of a tree. Each
slot holds one snapshot cut at a turn boundary; entries say which token prefix
lives in which slot::

    entries   key(prefix A[:812]) ─► slot 0        slots   0: A[:812]  content key K_A
              key(prefix B[:530]) ─► slot 1                1: B[:530]  content key K_B

A snapshot goes through three calls::

    prepare ─► (the runner crosses the boundary; the state is staged) ─► confirm
           └─► abort   (degenerate boundary, failed or aborted generation)

``prepare`` hands out the next slot round-robin and advances the counter at
once, so an aborted snapshot still burns a step. That is how a later confirm
wraps onto a slot a live entry still points at. The invariant ``confirm``
keeps: a slot holds exactly one snapshot, so at most one entry points at it,
and that entry's key equals the slot's content key. It erases every other
entry of the slot to keep it. ``check`` re-validates on the way in anyway:
an entry whose slot does not hold its prefix is a clean miss.

Nothing here touches pages; ``slot_backend`` moves them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from kvwatch.contracts import Finding, FindingKind, finding
from kvwatch.engine.faults import Fault

LONGER_THAN_PROMPT = "snapshot longer than the prompt"
CONTENT_MISMATCH = "slot holds another token stream"


class SlotTicket(NamedTuple):
    """A prepared snapshot: the slot it will go to and the prefix it will hold."""

    slot: int
    boundary: int
    key: bytes


class SlotEntry(NamedTuple):
    key: bytes  # hash of (config, extra key, tokens[:length])
    length: int
    slot: int


@dataclass(eq=False)
class Slot:
    """One snapshot slot. ``pages`` holds full.kv [0, length) and the state groups."""

    index: int
    key: bytes | None = None  # content key of what the pages hold; None when empty
    length: int = 0
    pages: dict[str, np.ndarray] = field(default_factory=dict)
    last_use: int = 0

    @property
    def empty(self) -> bool:
        return self.key is None


class SlotTable:
    def __init__(self, n_slots: int, fingerprint: str, faults: frozenset[Fault]) -> None:
        self.slots = [Slot(index=i) for i in range(n_slots)]
        self.entries: dict[bytes, SlotEntry] = {}
        self.next_slot = 0
        self.pinned: set[int] = set()  # slots being restored from: not evictable
        self.fingerprint = fingerprint.encode()
        self.faults = faults
        self._clock = 0

    def key(self, tokens: Sequence[int], length: int, extra_key: str | None) -> bytes:
        """The hash entries and slot contents are keyed by."""
        h = hashlib.blake2b(self.fingerprint, digest_size=16)
        h.update(b"\0" + (extra_key or "").encode() + b"\0")
        h.update(np.asarray(tokens[:length], dtype=np.int64).tobytes())
        return h.digest()

    def tick(self, slot: Slot) -> None:
        self._clock += 1
        slot.last_use = self._clock

    # -- lookup ---------------------------------------------------------------------
    def lookup(self, tokens: Sequence[int], limit: int, extra_key: str | None) -> SlotEntry | None:
        """The longest entry whose prefix (of at most ``limit`` tokens) ``tokens`` starts with."""
        for length in sorted(
            {e.length for e in self.entries.values() if e.length <= limit}, reverse=True
        ):
            entry = self.entries.get(self.key(tokens, length, extra_key))
            if entry is not None:
                return entry
        return None

    def check(
        self, entry: SlotEntry, tokens: Sequence[int], limit: int, extra_key: str | None
    ) -> str | None:
        """Why ``entry``'s slot cannot be restored for ``tokens``, or None when it can.

        A slot whose snapshot runs past ``limit`` is never restored (the state
        cannot step backwards). Then its content key must match the prompt: an
        entry can outlive the snapshot it described.
        """
        slot = self.slots[entry.slot]
        if slot.empty or slot.length > limit:
            return LONGER_THAN_PROMPT
        if Fault.STALE_SLOT_ENTRY in self.faults:  # the bug: trust the entry, restore blind
            return None
        if slot.key != self.key(tokens, slot.length, extra_key):
            return CONTENT_MISMATCH
        return None

    def has(self, key: bytes) -> bool:
        return key in self.entries

    # -- prepare / confirm / abort --------------------------------------------------
    def prepare(self, tokens: Sequence[int], boundary: int, extra_key: str | None) -> SlotTicket:
        """Reserve the next slot round-robin; the counter moves whatever happens next."""
        slot = self.next_slot
        self.next_slot = (slot + 1) % len(self.slots)
        return SlotTicket(slot, boundary, self.key(tokens, boundary, extra_key))

    def confirm(
        self, ticket: SlotTicket, pages: dict[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], int]:
        """Store a staged snapshot in its slot; returns the pages it replaced and
        how many stale entries of that slot were erased."""
        slot = self.slots[ticket.slot]
        old = slot.pages
        erased = 0
        if Fault.STALE_SLOT_ENTRY not in self.faults:
            erased = self._erase(ticket.slot)
        slot.key, slot.length, slot.pages = ticket.key, ticket.boundary, pages
        self.tick(slot)
        self.entries[ticket.key] = SlotEntry(ticket.key, ticket.boundary, ticket.slot)
        return old, erased

    def clear(self, index: int) -> dict[str, np.ndarray]:
        """Empty a slot (pressure or flush) and drop every entry that points at it."""
        slot = self.slots[index]
        pages = slot.pages
        self._erase(index)
        slot.key, slot.length, slot.pages = None, 0, {}
        return pages

    def _erase(self, index: int) -> int:
        stale = [k for k, e in self.entries.items() if e.slot == index]
        for k in stale:
            del self.entries[k]
        return len(stale)

    # -- audit ----------------------------------------------------------------------
    def findings(self) -> list[Finding]:
        """More than one entry per slot, or an entry whose key is not its slot's content."""
        out = []
        per_slot: dict[int, list[SlotEntry]] = {}
        for e in self.entries.values():
            per_slot.setdefault(e.slot, []).append(e)
        for index, entries in sorted(per_slot.items()):
            slot = self.slots[index]
            if len(entries) > 1:
                out.append(
                    finding(
                        FindingKind.SLOT_TABLE,
                        None,
                        [],
                        f"slot {index}: {len(entries)} entries (prefix lengths "
                        f"{sorted(e.length for e in entries)}) for one snapshot of {slot.length} tokens",
                    )
                )
            for e in entries:
                if e.key != slot.key or e.length != slot.length:
                    out.append(
                        finding(
                            FindingKind.SLOT_TABLE,
                            None,
                            [],
                            f"slot {index}: entry for a {e.length}-token prefix "
                            f"({e.key.hex()[:12]}) but the slot holds {slot.length} tokens "
                            f"({slot.key.hex()[:12] if slot.key else 'nothing'})",
                        )
                    )
        return out
