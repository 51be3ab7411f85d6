"""Bucket bounds of the latency histograms, in seconds, and the OTel views that set them.

The SDK's default bounds (0, 5, 10, 25, ... 10000) are meant for
milliseconds: recorded in seconds, every request of an LLM server lands in
the first bucket and ``histogram_quantile`` can only answer 2.5 or 4.95 s.
``views()`` goes to the ``MeterProvider`` of every ``Telemetry``, so each of
its readers (Prometheus, OTLP, an in-memory test reader) aggregates with these
bounds; nothing else spells them.

Both ladders are roughly geometric, so ``histogram_quantile``'s linear
interpolation inside a bucket is off by at most a fixed factor wherever a
latency falls:

* TTFT and end-to-end duration run from a few milliseconds (a short prompt on
  an idle server) to minutes (a long prompt behind a queue, a long
  generation). They use a 1-2-5 ladder, each bound 2 to 2.5 times the one
  before: 14 buckets cover 5 ms to 60 s. End-to-end goes on to 5 minutes,
  since a generation of thousands of tokens legitimately takes that long;
  a first token later than a minute is an outage, and +Inf says so.
* TPOT is a mean over a request's decode steps, so it varies far less than
  the others and sits between about 1 ms and a few hundred ms on any
  hardware; SLOs are set there in tens of milliseconds. Its ladder starts at
  1 ms with bounds about 1.5 times apart up to 1 s (1, 1.5, 2, 3, 5, 7.5 per
  decade), and only a stalled engine reaches the coarse 2, 5, 10 s tail.
"""

from __future__ import annotations

from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

from kvwatch.instrumentation import names as n

# 1-2-5 per decade from 5 ms, then half a minute and a minute
TTFT_S = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0)
REQUEST_DURATION_S = (*TTFT_S, 120.0, 300.0)
# 1, 1.5, 2, 3, 5, 7.5 per decade from 1 ms to 1 s, then a coarse tail
TPOT_S = (
    0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075,
    0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 2.0, 5.0, 10.0,
)  # fmt: skip

BOUNDS: dict[str, tuple[float, ...]] = {
    n.TTFT: TTFT_S,
    n.TPOT: TPOT_S,
    n.REQUEST_DURATION: REQUEST_DURATION_S,
}


def views() -> list[View]:
    """One view per latency histogram of kvwatch's meter, with its bounds."""
    return [
        View(
            instrument_name=name,
            meter_name=n.METER,
            aggregation=ExplicitBucketHistogramAggregation(boundaries=bounds),
        )
        for name, bounds in BOUNDS.items()
    ]
