"""ServerSettings: the HTTP server's own knobs, validated when built.

Every limit here bounds what one client can make the server hold or do
(body and header bytes, how long an idle session keeps its cache slot), so
each is checked once, at construction, and a bad value raises ValueError.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvwatch import MODEL_NAME

MIN_LIMIT_BYTES = 1024


@dataclass(frozen=True)
class ServerSettings:
    model_name: str = MODEL_NAME
    enable_probe: bool = False
    probe_token: str | None = None
    capture_content: bool = False  # put prompt text on spans (off: privacy by default)
    max_body_bytes: int = 4 * 1024 * 1024
    # All request header names and values together; more gets a JSON 431.
    max_header_bytes: int = 16 * 1024
    # Close a session no request has used for this long; None: sessions live until closed.
    session_idle_timeout_s: float | None = None
    # The engine steps only when asked (POST /debug/step): a client history placed at
    # chosen steps over real HTTP (the history tier's kvwatch-http target). Needs the probe.
    step_by_step: bool = False

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_header_bytes"):
            if getattr(self, name) < MIN_LIMIT_BYTES:
                raise ValueError(f"{name} must be >= {MIN_LIMIT_BYTES}, got {getattr(self, name)}")
        if self.probe_token is not None and not self.probe_token:
            raise ValueError("probe_token must not be empty")
        if self.step_by_step and not self.enable_probe:
            raise ValueError("step_by_step needs enable_probe (its steps are a probe endpoint)")
        timeout = self.session_idle_timeout_s
        if timeout is not None and not timeout > 0:  # also refuses NaN
            raise ValueError(f"session_idle_timeout_s must be > 0 seconds, got {timeout}")
