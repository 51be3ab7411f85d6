"""Who a page belongs to.

Every allocated page carries an owner tag ``(kind, id)`` in its pool. Tags move
when ownership moves (a request's computed page becomes a tree node's page at
commit), so the audit can compare the tags against what live holders claim.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple


class OwnerKind(IntEnum):
    FREE = 0
    NODE = 1  # a radix-tree node (history pages or a continuation snapshot)
    REQUEST = 2  # a running or retracted request's private pages
    SESSION = 3  # a streaming session's slot, kept across turns
    SLOT = 4  # a snapshot slot of the slot-cache backend


# The probe reports tree nodes as "tree".
OWNER_LABEL = {
    OwnerKind.NODE: "tree",
    OwnerKind.REQUEST: "request",
    OwnerKind.SESSION: "session",
    OwnerKind.SLOT: "slot",
}


class Owner(NamedTuple):
    kind: OwnerKind
    id: int

    def __str__(self) -> str:
        return f"{OWNER_LABEL.get(self.kind, self.kind.name.lower())} {self.id}"
