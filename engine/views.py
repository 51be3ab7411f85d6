"""Read-only records the ``Engine`` answers with, so callers never hold its internals.

Each is a frozen copy taken at the moment of the call: keeping one changes
nothing in the engine, and the engine changing later does not change it.
"""

from __future__ import annotations

from typing import NamedTuple

from kvwatch.engine.request import DONE, SamplingParams, Status


class ComputedBatch(NamedTuple):
    """A step's batch after its forward ran and before its results are applied."""

    step: int
    request_ids: tuple[str, ...]
    drafts: tuple[int, ...]  # draft tokens each request verifies, in ``request_ids`` order

    @property
    def verifying(self) -> tuple[str, ...]:
        """The requests whose piece of this batch is a verify step (it carries drafts)."""
        return tuple(rid for rid, n in zip(self.request_ids, self.drafts, strict=True) if n)


class RequestInfo(NamedTuple):
    """A request as the engine holds it: live, or ended and not yet taken."""

    request_id: str
    status: Status
    params: SamplingParams
    prompt_tokens: int
    output_tokens: int  # generated so far
    cached_tokens: int  # prompt tokens served from the cache at first admission
    session_id: str | None  # the session whose turn it is

    @property
    def done(self) -> bool:
        return self.status in DONE


class SessionInfo(NamedTuple):
    """An open streaming session."""

    session_id: str
    tokens: int  # the conversation's length so far
    turns: int  # finished turns it keeps (a rollback removes them)
    in_flight: str | None  # the id of the turn being served
    record: bool  # each finished turn leaves a record
    routed_experts: bool  # and its routed-expert blob
