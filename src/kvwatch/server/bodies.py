"""Request bodies of the OpenAI-compatible API, as pydantic models.

Validation failures become 400 errors in OpenAI's shape (see errors.py).
Fields kvwatch adds to the OpenAI schema: ``session_id`` (a streaming
session's next turn), ``return_routed_experts``, ``return_token_ids`` (the
prompt's and the output's token ids, as vLLM offers), ``ignore_eos``, and
``kvwatch`` (test controls, accepted only with ``--enable-probe``). Unknown
fields are ignored, as OpenAI-compatible servers commonly do.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessageIn(_Body):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(_Body):
    include_usage: bool = False


class TestControls(_Body):
    """A leak test's control over one request (``--enable-probe`` only).

    ``retract_after``: once the request has computed this many tokens past the
    prefix it found cached, push it out to the host tier as pool pressure
    would, and hold it there for ``hold_steps`` engine steps.
    ``pause_after_output``: once it has generated this many tokens, pause it
    (its pages go back without a commit) and resume it after ``hold_steps``
    engine steps, or at once when nothing else runs; ``hold_s``: after that
    many seconds instead, never earlier. ``abort_in``: then abort it, through
    the engine's own abort path, at the first step boundary where it is
    retracted, paused, or recovering (admitted again and still computing its
    prompt); alone, abort it as it is queued, at the first step boundary
    where it is prefilling or decoding, or inside the step that verifies its
    drafts (``verifying``): the aborts no client can time. ``fail_load`` (with
    ``retract_after``): once its hold is over, the next load of a host-tier
    snapshot back to the device fails as a full device pool fails it (the
    ``tier.load`` failpoint), so its recovery takes the path a full pool takes.
    """

    retract_after: int | None = Field(default=None, ge=1, le=1_000_000)
    pause_after_output: int | None = Field(default=None, ge=1, le=1_000_000)
    hold_steps: int = Field(default=64, ge=0, le=100_000)
    hold_s: float | None = Field(default=None, gt=0, le=600)
    fail_load: bool = False
    abort_in: (
        Literal[
            "queued", "prefilling", "decoding", "verifying", "retracted", "paused", "recovering"
        ]
        | None
    ) = None


class _Sampling(_Body):
    model: str = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=1)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    session_id: str | None = Field(default=None, pattern=ID_PATTERN)
    return_routed_experts: bool = False
    return_token_ids: bool = False
    ignore_eos: bool = False
    kvwatch: TestControls | None = None

    @field_validator("stop")
    @classmethod
    def _no_stop_strings(cls, v: str | list[str] | None) -> None:
        if v:  # the byte-level model stops on its end-of-turn token only
            raise ValueError("stop sequences are not supported by this server")
        return None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessageIn] = Field(min_length=1, max_length=4096)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | list[int] = Field(min_length=1)
    logprobs: int | None = Field(default=None, ge=0, le=1)
    echo: Literal[False] = False

    @field_validator("prompt")
    @classmethod
    def _token_ids(cls, v: str | list[int]) -> str | list[int]:
        if isinstance(v, list) and any(t < 0 for t in v):
            raise ValueError("token ids must be non-negative")
        return v

    @property
    def token_limit(self) -> int | None:
        return self.max_tokens


class SessionOpen(_Body):
    session_id: str | None = Field(default=None, pattern=ID_PATTERN)
    record: bool = False
    routed_experts: bool = False


class SessionRollback(_Body):
    steps: int = Field(default=1, ge=1)
