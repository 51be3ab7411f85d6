"""kvwatch.instrumentation: OpenTelemetry for the reference engine, as listeners,
and the leak detectors that judge recorded runs.

    telemetry = Telemetry(run_dir="runs/1")
    inst = instrument(engine.events, engine.stats, telemetry)   # or a worker's stats
    ...
    inst.close(); telemetry.shutdown()

The OTel parts load on first use, so the detectors and the pytest plugin do
not pull the SDK into every test session.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from kvwatch.engine.events import EventBus
    from kvwatch.engine.probe import EngineStats
    from kvwatch.instrumentation.metrics import EngineMetrics
    from kvwatch.instrumentation.providers import Telemetry
    from kvwatch.instrumentation.spans import RequestSpans


class Instrumentation(NamedTuple):
    metrics: EngineMetrics
    spans: RequestSpans

    def close(self) -> None:
        self.metrics.close()
        self.spans.close()


def instrument(
    events: EventBus,
    stats: Callable[[], EngineStats],
    telemetry: Telemetry,
    *,
    stats_max_age: float = 0.25,
) -> Instrumentation:
    """Subscribe metrics and spans to an engine's events; gauges poll ``stats``
    (one read serves every gauge for ``stats_max_age`` seconds)."""
    from kvwatch.instrumentation.metrics import EngineMetrics
    from kvwatch.instrumentation.spans import RequestSpans

    return Instrumentation(
        EngineMetrics(telemetry.meter, events, stats, stats_max_age),
        RequestSpans(telemetry.tracer, events),
    )


def __getattr__(name: str) -> Any:
    if name == "Telemetry":
        from kvwatch.instrumentation.providers import Telemetry

        return Telemetry
    raise AttributeError(name)


__all__ = ["Instrumentation", "Telemetry", "instrument"]
