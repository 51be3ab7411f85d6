"""Host-tier snapshots left as cache, then taken back by pressure or by a flush.

A retracted request's snapshot moves to the host tier; aborted while retracted,
it leaves the snapshot there as cache. With a host tier of a few snapshots,
later retractions must take such cache back (``host -> pruned``), and the flush
takes back the rest (``host -> flushed``): the lifecycle counter sees each
edge, and every page comes back. A prune that drops a cached snapshot without
freeing its host pages is found by the audit.
"""

from __future__ import annotations

import pytest

from kvwatch.engine import Engine, EngineConfig, SamplingParams
from kvwatch.engine.cache import storage
from kvwatch.engine.cache.node import Tier
from kvwatch.engine.overrides import apply_overrides
from kvwatch.instrumentation.lifecycle import LifecycleCounter

HOST = 2  # snapshots the host tier holds, per state group
CONFIG = {
    "cache": {
        "swa_window": {"host_capacity": HOST},
        "linear_state": {"host_capacity": HOST},
    }
}


def retract_and_abort(engine: Engine, i: int) -> None:
    """A request past its first snapshot, retracted (its snapshot to the host), then
    aborted while it waits there: the snapshot stays on the host as cache."""
    rid = engine.add_request(f"request {i} about the host tier " * 4, SamplingParams(max_tokens=64))
    while engine.computed_beyond_cache(rid) is None or engine.request_info(rid).output_tokens < 2:
        engine.step()
    engine.retract(rid, hold_steps=100_000)
    engine.step()
    engine.abort(rid)
    engine.step()
    engine.take(rid)


def run(n: int = 2 * HOST + 2) -> tuple[Engine, dict]:
    engine = Engine(apply_overrides(EngineConfig(), CONFIG))
    counter = LifecycleCounter(engine.events)
    for i in range(n):
        retract_and_abort(engine, i)
    engine.flush_cache()
    return engine, counter.taken()["host snapshot"]


def test_host_cache_is_taken_back_by_pressure_and_by_the_flush_every_page_back():
    engine, taken = run()
    assert taken.get("device -> host", 0) > HOST  # more offloads than the host holds
    assert taken.get("host -> pruned", 0) > 0 and taken.get("host -> flushed", 0) > 0, taken
    report = engine.probe()
    assert report.clean, report.findings
    assert all(g.by_owner["host"] == 0 for g in report.groups.values())
    assert all(g.free == g.capacity for g in report.groups.values())


def test_a_prune_that_keeps_the_host_pages_is_found(monkeypatch):
    honest = storage.CacheStorage.drop_snapshot

    def leaky(self, node, reason, into=None):
        if into is None and reason == "pruned" and node.snapshot.tier is Tier.HOST:
            self.tree.detach_state(node)  # the pages are never freed
            return
        honest(self, node, reason, into)

    monkeypatch.setattr(storage.CacheStorage, "drop_snapshot", leaky)
    engine, taken = run()
    assert taken.get("host -> pruned", 0) == 0  # no event: the leak is silent
    kinds = {str(f.kind) for f in engine.probe().findings}
    assert "orphan" in kinds, kinds


@pytest.mark.parametrize("n", [HOST])
def test_within_the_host_tier_nothing_is_pruned(n):
    _, taken = run(n)
    assert taken.get("host -> pruned", 0) == 0 and taken.get("host -> flushed", 0) > 0
