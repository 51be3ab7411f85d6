"""The flags of ``kvwatch gate`` that say what is under test, and the one place they pick a target.

    --target URL --metrics-url URL [--gauges P] [--gauge S]...    HttpTarget (black-box)
    --engine kvwatch (default) [--inject F]... [--max-replays N]  KvwatchTarget
    --engine vllm --model DIR [--vllm-python P] [--vllm-arg A]...  VllmTarget

``choose`` raises ValueError (the CLI's exit 2) for flags that do not fit the
target they pick, with the message the user reads.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvwatch import MODEL_NAME
from kvwatch.gate.options import is_http_url
from kvwatch.gate.plan import preset
from kvwatch.gate.target import Target


@dataclass(frozen=True, kw_only=True)
class TargetFlags:
    engine: str | None = None  # None: kvwatch (or, with --target, whatever serves there)
    target: str | None = None
    metrics_url: str | None = None
    gauges: str | None = None  # a preset's name; default: the engine's own
    extra_gauges: tuple[str, ...] = ()
    faults: tuple[str, ...] = ()
    model: str = MODEL_NAME
    max_replays: int | None = None
    vllm_python: str = sys.executable
    vllm_args: tuple[str, ...] = ()


def _http(flags: TargetFlags, out: Path) -> Target:
    from kvwatch.targets.http_target import HttpTarget

    if flags.engine is not None and flags.engine != "kvwatch":
        raise ValueError(
            f"--engine {flags.engine} starts {flags.engine} itself; it does not take --target"
        )
    if flags.target is None or flags.metrics_url is None:
        raise ValueError("--target and --metrics-url go together")
    for flag, url in (("--target", flags.target), ("--metrics-url", flags.metrics_url)):
        if not is_http_url(url):
            raise ValueError(f"{flag} takes an http(s) URL, not {url!r}")
    if flags.engine is not None and flags.engine != "kvwatch":
        raise ValueError(
            f"--engine {flags.engine} starts {flags.engine} itself; it does not take --target"
        )
    if flags.faults:
        raise ValueError("--inject needs the embedded engine; it cannot reach a --target")
    gauges = preset(flags.gauges or "kvwatch", flags.extra_gauges)
    return HttpTarget(flags.target, flags.metrics_url, gauges, model=flags.model)


def _kvwatch(flags: TargetFlags, out: Path) -> Target:
    from kvwatch.targets.kvwatch_target import KvwatchTarget

    gauges = preset(flags.gauges or "kvwatch", flags.extra_gauges)
    return KvwatchTarget(
        out,
        faults=flags.faults,
        model=flags.model,
        max_replays=flags.max_replays,
        gauges=gauges,
    )


def _vllm(flags: TargetFlags, out: Path) -> Target:
    from kvwatch.targets.vllm_target import VllmTarget

    gauges = preset(flags.gauges or "vllm", flags.extra_gauges)
    return VllmTarget(
        out,
        flags.vllm_python,
        Path(flags.model),
        gauges,
        faults=flags.faults,
        args=flags.vllm_args,
    )


ENGINES: dict[str, Callable[[TargetFlags, Path], Target]] = {
    "kvwatch": _kvwatch,
    "vllm": _vllm,
}


def choose(flags: TargetFlags, out: Path) -> Target:
    """The target ``flags`` describe, writing under ``out``."""
    if flags.max_replays is not None and flags.max_replays < 1:
        raise ValueError("--max-replays must be >= 1")
    if flags.target is not None or flags.metrics_url is not None:
        return _http(flags, out)
    engine = flags.engine or "kvwatch"
    if engine not in ENGINES:
        raise ValueError(f"--engine is one of {', '.join(ENGINES)}, not {engine!r}")
    return ENGINES[engine](flags, out)
