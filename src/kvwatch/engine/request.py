"""Requests as the engine sees them: parameters, lifecycle state and outputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, NamedTuple

import torch

from kvwatch.engine.cache.protocol import Handle
from kvwatch.engine.model.tokenizer import STOP_TOKENS

if TYPE_CHECKING:
    from kvwatch.engine.records import Session


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0 is greedy
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False
    return_routed_experts: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Status(StrEnum):
    WAITING = "waiting"  # queued, holds nothing
    RUNNING = "running"  # holds a lock and pages
    RETRACTED = "retracted"  # pushed out under pressure; holds a host ref, queued to recover
    PAUSED = "paused"  # released without commit, waits for resume()
    FINISHED = "finished"
    ABORTED = "aborted"
    FAILED = "failed"


DONE = frozenset({Status.FINISHED, Status.ABORTED, Status.FAILED})


@dataclass(eq=False)
class Request:
    id: str
    tokens: list[int]  # prompt, then every token sampled so far; only ever appended to
    prompt_len: int
    params: SamplingParams
    arrival: int  # engine step at arrival; lower runs first
    extra_key: str | None = None
    status: Status = Status.WAITING
    holder: Handle | None = None
    cached_tokens: int = 0  # prompt tokens served from the cache at first admission
    finish_reason: str | None = None
    error: str | None = None
    logprobs: list[float] = field(default_factory=list)
    routed_experts: torch.Tensor | None = None  # (computed tokens, n_layers, top_k), when asked
    generator: torch.Generator | None = None
    admitted: bool = False
    waiting_for_prefix: bool = False  # a RequestWaiting went out and it is not admitted yet
    not_before: int = 0  # engine step before which it is not admitted (retraction backoff)
    session: Session | None = None  # a streaming-session turn; tokens is then the session's list
    labels: tuple[tuple[str, str], ...] = ()  # passed on in RequestAdded, never read

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    @property
    def done(self) -> bool:
        return self.status in DONE

    def accept(self, new: tuple[int, ...], max_model_len: int) -> tuple[list[int], str | None]:
        """The new tokens up to the first stop condition, and that condition
        (``stop``, ``length``, or None to go on)."""
        params, kept = self.params, []
        for tok in new:
            kept.append(tok)
            if tok in params.stop_token_ids or (tok in STOP_TOKENS and not params.ignore_eos):
                return kept, "stop"
            if len(self.output_ids) + len(kept) >= params.max_tokens:
                return kept, "length"
            if len(self.tokens) + len(kept) >= max_model_len:
                return kept, "length"
        return kept, None


class RequestOutput(NamedTuple):
    """What one step produced for one request (a streaming delta)."""

    request_id: str
    new_token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None = None
    error: str | None = None
