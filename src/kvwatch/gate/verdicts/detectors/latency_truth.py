"""The server's latency histograms never report a request slower than its client saw it.

A server's window on a request lies inside its client's: the server hears
the request after the client sent it, and records the first token, or the
end, before the client can read it::

    client   sent |--------------------------------------------| read the end
    server          added |----- first token ------- finished |
                          '- TTFT -'
                          '------------ duration -------------'

So, request by request, the server's time to first token is at most the
client's (``Timings.ttft_ms``: to the first content chunk), its duration at
most the client's whole request (``Timings.finished``: the answers that
finished, ``stop`` or ``length``), and its time per output token,
(end - first) / (n - 1), at most the client's whole request over n - 1.
The server also times every request the clients timed, and more (those a
client left or that failed). Hence, for every bucket bound ``le`` of each
histogram, over the run::

    rise of  <histogram>_bucket{le}  >=  client samples <= le

A histogram recorded in the wrong unit, from the wrong moment (a first token
stamped when the request ends), or that loses observations breaks this. A
busy machine cannot: it only stretches the client's side. The other way (a
server figure too small) depends on the machine's speed and is left to
``tests/dashboards/test_prometheus_truth.py``. The rises are read by the
target around its run (``RunRecord.counters``), the client's timings by the
load (``loadtests/timings.py``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from kvwatch.gate.verdicts.detectors.verdict import Evidence
from kvwatch.harness.run_record import RunRecord, Timings
from kvwatch.harness.scrape import parse_spec
from kvwatch.instrumentation import names as n

HISTOGRAMS = (n.TTFT, n.TPOT, n.REQUEST_DURATION)
BUCKET_SERIES = tuple(n.prom(h) + "_bucket" for h in HISTOGRAMS)


def bucket_rises(counters: Mapping[str, float], histogram: str) -> dict[float, float]:
    """Each bucket bound's rise over the run (every label set together), by ``le``."""
    name = n.prom(histogram) + "_bucket"
    out: dict[float, float] = defaultdict(float)
    for series, rise in counters.items():
        got, labels = parse_spec(series)
        if got == name and "le" in labels:
            out[float(labels["le"])] += rise
    return dict(out)


def client_bounds(timings: Timings) -> dict[str, list[float]]:
    """Per histogram, the client's measurement that bounds the server's, in seconds."""
    return {
        n.TTFT: [ms / 1000 for ms in timings.ttft_ms],
        n.REQUEST_DURATION: [ms / 1000 for ms, _ in timings.finished],
        n.TPOT: [ms / 1000 / (tokens - 1) for ms, tokens in timings.finished if tokens > 1],
    }


def untrue(run: RunRecord) -> list[Evidence]:
    """Each bucket where the server counted fewer requests at or below its bound
    than its clients measured there; empty where the record has no readings of
    the buckets or no client timings."""
    if run.counters is None or run.timings is None:
        return []
    ev = []
    for histogram, measured in client_bounds(run.timings).items():
        rises = bucket_rises(run.counters, histogram)
        if not rises:
            continue  # a target whose counters leave the histograms out
        for le in sorted(rises):
            seen = sum(1 for s in measured if s <= le)
            if rises[le] < seen:
                detail = (
                    f"{n.prom(histogram)}_bucket{{le={le:g}}} rose {rises[le]:g} over the run; "
                    f"its clients measured {seen} requests at or below {le:g} s, and the "
                    "server's time for a request is never above its client's"
                )
                ev.append(Evidence(group=None, pages=(), detail=detail))
                break  # the lowest bucket that says it is enough
    return ev
