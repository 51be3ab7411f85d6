"""The pool gauges' stats: one engine read serves a scrape, and every scrape reads afresh.

A reader at a turn barrier scrapes right after changing the engine (a probe, a
flush, a session closed); the gauges must say what the engine holds now, not
what an earlier scrape read, without the reader waiting out the cache's age.
"""

from __future__ import annotations

import httpx
from inprocserver import metric, serving

import kvwatch.serve as serve
from kvwatch.instrumentation.metrics import StatsCache
from kvwatch.instrumentation.names import SESSIONS_LIVE, prom
from kvwatch.serve import ServeOptions, build


def test_the_cache_serves_within_its_age_and_reads_again_once_expired():
    reads = []
    cache = StatsCache(lambda: reads.append(len(reads)) or len(reads), max_age=3600)
    assert cache.get() == cache.get() == 1  # one read serves every gauge
    cache.expire()
    assert cache.get() == 2 and len(reads) == 2


def test_a_scrape_right_after_a_change_sees_it(monkeypatch):
    """With a cache that would keep a read for an hour, each scrape still reads the
    engine: a session opened between two scrapes is in the second."""
    monkeypatch.setattr(serve, "STATS_MAX_AGE_S", 3600.0)
    app, _worker, telemetry = build(ServeOptions())
    try:
        with serving(app) as url:
            live = prom(SESSIONS_LIVE)
            assert metric(url, live) == 0
            httpx.post(f"{url}/v1/sessions", json={}, timeout=60).raise_for_status()
            assert metric(url, live) == 1
    finally:
        telemetry.shutdown()
