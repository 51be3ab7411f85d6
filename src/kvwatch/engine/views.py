"""Read-only records the ``Engine`` answers with, so callers never hold its internals.

Each is a frozen copy taken at the moment of the call: keeping one changes
nothing in the engine, and the engine changing later does not change it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

import torch

from kvwatch.contracts import Finding, FindingKind, finding
from kvwatch.engine.request import DONE, SamplingParams, Status

if TYPE_CHECKING:
    from kvwatch.engine.records import Session


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


class Completion(NamedTuple):
    """A request's result, once it finished, was aborted or failed (build it with keywords)."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    cached_tokens: int
    logprobs: list[float]
    routed_experts: torch.Tensor | None
    error: str | None


def session_info_of(session: Session) -> SessionInfo:
    """A frozen copy of what a session is now."""
    return SessionInfo(
        session_id=session.id,
        tokens=len(session.tokens),
        turns=max(0, len(session.turn_ends) - 1),
        in_flight=session.in_flight,
        record=session.records is not None,
        routed_experts=session.routed_experts,
    )


def listener_finding(failures: Mapping[str, int]) -> Finding | None:
    """One ``listener`` finding when event handlers raised (isolated by the bus)."""
    if not failures:
        return None
    counts = ", ".join(f"{name} {n}" for name, n in sorted(failures.items()))
    detail = f"event handlers raised {sum(failures.values())} times ({counts}); see the log"
    return finding(FindingKind.LISTENER, None, [], detail)
