"""Read-only records the ``Engine`` answers with, so callers never hold its internals.

Each is a frozen copy taken at the moment of the call: keeping one changes
nothing in the engine, and the engine changing later does not change it.
"""

from __future__ import annotations

from typing import NamedTuple


class ComputedBatch(NamedTuple):
    """A step's batch after its forward ran and before its results are applied."""

    step: int
    request_ids: tuple[str, ...]
    drafts: tuple[int, ...]  # draft tokens each request verifies, in ``request_ids`` order

    @property
    def verifying(self) -> tuple[str, ...]:
        """The requests whose piece of this batch is a verify step (it carries drafts)."""
        return tuple(rid for rid, n in zip(self.request_ids, self.drafts, strict=True) if n)
