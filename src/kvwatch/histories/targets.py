"""The engines the history tier can play on, by name: a saved history's target built again."""

from __future__ import annotations

from typing import Any

from kvwatch.targets.driver.history_target import HistoryTarget

ENGINES = ("kvwatch", "kvwatch-http", "sglang", "vllm", "lightllm")


def target_from(data: dict[str, Any]) -> HistoryTarget:
    """The target ``data`` (a target's ``describe()``) names, built again."""
    engine = data.get("engine")
    if engine == "kvwatch":
        from kvwatch.targets.kvwatch.histories import KvwatchHistoryTarget

        return KvwatchHistoryTarget(
            sets=tuple(data.get("sets", ())), faults=tuple(data.get("faults", ()))
        )
    if engine == "kvwatch-http":  # the same engine, served and driven over HTTP
        from kvwatch.targets.kvwatch.http_histories import KvwatchHttpHistoryTarget

        return KvwatchHttpHistoryTarget(
            sets=tuple(data.get("sets", ())), faults=tuple(data.get("faults", ()))
        )
    if engine == "sglang":
        from kvwatch.targets.sglang.histories import SglangHistoryTarget

        return SglangHistoryTarget(
            version=data.get("version") or "0.5.23", setup=data.get("setup") or "sessions-retract"
        )
    if engine == "vllm":
        from kvwatch.targets.vllm.histories import NEWEST, VllmHistoryTarget

        return VllmHistoryTarget(
            version=data.get("version") or NEWEST, setup=data.get("setup") or "plain"
        )
    if engine == "lightllm":  # the checkout: --lightllm-src, else $KVWATCH_LIGHTLLM_SRC
        from kvwatch.targets.lightllm.histories import LightllmHistoryTarget

        return LightllmHistoryTarget(src=data.get("src"), setup=data.get("setup") or "radix")
    raise ValueError(f"no history target for engine {engine!r}; engines: {', '.join(ENGINES)}")
