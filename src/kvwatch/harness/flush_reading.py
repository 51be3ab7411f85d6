"""What the pool gauges said around the drain's flush, beside the probe's own count.

At the end of a white-box run the recorder drains the engine, then flushes
its cache and probes it (``RunRecord.drained``). Where the target names pool
gauges (``GaugePreset.truth``: kvwatch's ``kvwatch_pool_pages``), it also
reads them at both ends of the flush, the engine idle throughout::

    idle ─► probe (``before``) + pool gauges (``gauges_before``) ─► flush
         ─► drained probe (the record's) + pool gauges (``gauges_after``)

so the gate can hold each gauge to the probe of the same moment, and the
evictable figure to what the flush then freed (``gate/verdicts/detectors/gauge_trend.py``).
"""

from __future__ import annotations

from typing import NamedTuple

from kvwatch.contracts import ProbeReport


class FlushReading(NamedTuple):
    before: ProbeReport  # the probe just before the flush
    gauges_before: dict[str, float]  # the pool gauges then, by series
    gauges_after: dict[str, float]  # and just after the flush, beside ``RunRecord.drained``

    def to_json(self) -> dict:
        return {
            "before": self.before.to_json(),
            "gauges_before": self.gauges_before,
            "gauges_after": self.gauges_after,
        }

    @classmethod
    def from_json(cls, data: dict | None) -> FlushReading | None:
        if not data:
            return None
        return cls(
            before=ProbeReport.from_json(data["before"]),
            gauges_before=dict(data["gauges_before"]),
            gauges_after=dict(data["gauges_after"]),
        )
