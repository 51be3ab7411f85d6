"""The flags of ``kvwatch gate`` that say what is under test, and the one place they pick a target.

    --target URL --metrics-url URL [--gauges P] [--gauge S]...    HttpTarget (black-box)
    --engine kvwatch (default) [--inject F]... [--max-replays N]  KvwatchTarget
               [--engine-set KEY=VALUE]...
    --engine vllm --model DIR [--vllm-python P] [--vllm-arg A]...  VllmTarget
               [--vllm-version V]
    --engine vllm-scheduler [--vllm-python P] [--vllm-version V]  VllmSchedulerTarget
    --engine sglang-cache --sglang-version V [--sglang-cache C] [--page-size N]
                                                                  SglangCacheTarget
    --engine lightllm-cache --lightllm-src DIR [--lightllm-cache C]
                                                                  LightllmCacheTarget

``choose`` raises ValueError (the CLI's exit 2) for flags that do not fit the
target they pick, with the message the user reads.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvwatch import MODEL_NAME
from kvwatch.harness.plan import preset
from kvwatch.harness.target import Target
from kvwatch.processes import is_http_url


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
    vllm_version: str | None = None  # a release beside --vllm-python's (targets/vllm/release.py)
    sglang_version: str | None = None  # --engine sglang-cache only, as the two below
    sglang_cache: str | None = None  # default: radix
    page_size: int | None = None  # default: 1
    lightllm_src: str | None = None  # --engine lightllm-cache only, as the one below
    lightllm_cache: str | None = None  # default: radix
    seed: int = 0  # the gate's: kvwatch's failpoints draw from it
    engine_sets: tuple[str, ...] = ()  # --engine-set KEY=VALUE, kvwatch only


def _http(flags: TargetFlags, out: Path) -> Target:
    from kvwatch.targets.http.target import HttpTarget

    if flags.engine is not None and flags.engine != "kvwatch":
        raise ValueError(
            f"--engine {flags.engine} starts {flags.engine} itself; it does not take --target"
        )
    if flags.target is None or flags.metrics_url is None:
        raise ValueError("--target and --metrics-url go together")
    for flag, url in (("--target", flags.target), ("--metrics-url", flags.metrics_url)):
        if not is_http_url(url):
            raise ValueError(f"{flag} takes an http(s) URL, not {url!r}")
    if flags.faults:
        raise ValueError("--inject needs the embedded engine; it cannot reach a --target")
    gauges = preset(flags.gauges or "kvwatch", flags.extra_gauges)
    return HttpTarget(flags.target, flags.metrics_url, gauges, model=flags.model)


def _kvwatch(flags: TargetFlags, out: Path) -> Target:
    from kvwatch.targets.kvwatch.target import KvwatchTarget

    gauges = preset(flags.gauges or "kvwatch", flags.extra_gauges)
    return KvwatchTarget(
        out,
        faults=flags.faults,
        model=flags.model,
        max_replays=flags.max_replays,
        gauges=gauges,
        seed=flags.seed,
        engine_sets=flags.engine_sets,
    )


def _vllm(flags: TargetFlags, out: Path) -> Target:
    from kvwatch.targets.vllm.target import VllmTarget

    gauges = preset(flags.gauges or "vllm", flags.extra_gauges)
    python, env = flags.vllm_python, {}
    if flags.vllm_version is not None:
        from kvwatch.targets.vllm.release import find

        release = find(flags.vllm_version, flags.vllm_python)
        if not release.serves:
            raise ValueError(release.why_not_served())
        python, env = release.python, release.env()
    return VllmTarget(
        out,
        python,
        Path(flags.model),
        gauges,
        faults=flags.faults,
        args=flags.vllm_args,
        env=env,
    )


def _vllm_scheduler(flags: TargetFlags, out: Path) -> Target:
    from kvwatch.targets.vllm.release import ask, find
    from kvwatch.targets.vllm.scheduler_target import VllmSchedulerTarget

    if flags.faults or flags.vllm_args:
        raise ValueError("--engine vllm-scheduler takes neither --inject nor --vllm-arg")
    version = flags.vllm_version or ask(flags.vllm_python).get("vllm")
    if version is None:
        raise ValueError(
            f"--engine vllm-scheduler: {flags.vllm_python} has no vLLM "
            "(--vllm-python, or $KVWATCH_VLLM_PYTHON)"
        )
    return VllmSchedulerTarget(out, find(version, flags.vllm_python))


def _sglang_cache(flags: TargetFlags, out: Path) -> Target:
    from kvwatch.targets.sglang.target import SglangCacheTarget

    if flags.sglang_version is None:
        raise ValueError("--engine sglang-cache needs --sglang-version V, e.g. 0.5.23")
    if flags.faults:
        raise ValueError("--engine sglang-cache runs SGLang as released; it takes no --inject")
    return SglangCacheTarget(
        flags.sglang_version,
        cache=flags.sglang_cache or "radix",
        page_size=1 if flags.page_size is None else flags.page_size,
    )


def _sglang_flags_alone(flags: TargetFlags, engine: str) -> None:
    """The ``--sglang-*`` flags and ``--page-size`` go with ``--engine sglang-cache`` only."""
    names = ("sglang_version", "sglang_cache", "page_size")
    given = [f"--{n.replace('_', '-')}" for n in names if getattr(flags, n) is not None]
    if given and (engine != "sglang-cache" or flags.target is not None):
        raise ValueError(f"{', '.join(given)} goes with --engine sglang-cache only")


def _lightllm_cache(flags: TargetFlags, out: Path) -> Target:
    from kvwatch.targets.lightllm.checkout_check import find_checkout
    from kvwatch.targets.lightllm.target import LightllmCacheTarget

    if flags.lightllm_src is None:
        raise ValueError("--engine lightllm-cache needs --lightllm-src DIR, a LightLLM checkout")
    if flags.faults:
        raise ValueError("--engine lightllm-cache runs LightLLM as it is; it takes no --inject")
    cache = flags.lightllm_cache or "radix"
    return LightllmCacheTarget(find_checkout(flags.lightllm_src, cache), cache=cache)


def _lightllm_flags_alone(flags: TargetFlags, engine: str) -> None:
    """The ``--lightllm-*`` flags go with ``--engine lightllm-cache`` only."""
    names = ("lightllm_src", "lightllm_cache")
    given = [f"--{n.replace('_', '-')}" for n in names if getattr(flags, n) is not None]
    if given and (engine != "lightllm-cache" or flags.target is not None):
        raise ValueError(f"{', '.join(given)} goes with --engine lightllm-cache only")


ENGINES: dict[str, Callable[[TargetFlags, Path], Target]] = {
    "kvwatch": _kvwatch,
    "vllm": _vllm,
    "vllm-scheduler": _vllm_scheduler,
    "sglang-cache": _sglang_cache,
    "lightllm-cache": _lightllm_cache,
}


def choose(flags: TargetFlags, out: Path) -> Target:
    """The target ``flags`` describe, writing under ``out``."""
    if flags.max_replays is not None and flags.max_replays < 1:
        raise ValueError("--max-replays must be >= 1")
    engine = flags.engine or "kvwatch"
    if flags.engine_sets and (engine != "kvwatch" or flags.target is not None):
        raise ValueError("--engine-set configures the embedded kvwatch engine only")
    _sglang_flags_alone(flags, engine)
    _lightllm_flags_alone(flags, engine)
    if flags.vllm_version is not None and not engine.startswith("vllm"):
        raise ValueError("--vllm-version picks the vLLM that --engine vllm or vllm-scheduler runs")
    if flags.target is not None or flags.metrics_url is not None:
        return _http(flags, out)
    if engine not in ENGINES:
        raise ValueError(f"--engine is one of {', '.join(ENGINES)}, not {engine!r}")
    return ENGINES[engine](flags, out)
