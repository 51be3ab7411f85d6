"""SGLang's own ``Scheduler`` driven in this process from the wheels of 0.5.11 (its
settings in ``ServerArgs``) and of three releases that read ``runtime_context``,
one per way a request records its tree lock: 0.5.17 (``last_node``), 0.5.20
(a receipt) and 0.5.23, the newest (a ``TreeLock``).

The driver is the release's class, stepped one loop iteration at a time; the
scheduler paths the new profiles exist for are taken as SGLang takes them:
priority scheduling with a queued-requests limit (higher-priority arrivals
evict queued requests, a full queue rejects one, a lowest-priority request
times out waiting), aborts at every stage, and a scheduler that stops
admitting, which the probe reports. The wheel is downloaded at test time
(once per machine); skipped, saying why, when PyPI cannot be reached.
"""

from __future__ import annotations

import collections

import pytest
from packaging.version import Version
from sglang_drive import drive, load

from kvwatch.contracts import FindingKind
from kvwatch.targets.sglang import scheduler_workloads
from kvwatch.targets.sglang.loop_parts import (
    ABORTED,
    ABORTED_IN_QUEUE,
    FINISHED,
    REJECTED,
    TIMED_OUT,
)
from kvwatch.targets.sglang.recording import record_run

pytestmark = pytest.mark.e2e
VERSIONS = ("0.5.11", "0.5.17", "0.5.20", "0.5.23")
STALL_FIXED = "0.5.22"  # docs/real-bugs.json sglang-admission-stall-empty-batch


@pytest.fixture(scope="module", params=VERSIONS)
def release(request):
    return load(request.param)


def test_the_driver_is_the_release_scheduler_one_iteration_a_step(release):
    driver = drive(release, scheduler_workloads.Priority(c=2, seed=0))
    scheduler = release.modules["sglang.srt.managers.scheduler"].Scheduler
    assert isinstance(driver.sched, scheduler)
    assert driver.loop.iterations == driver.step_no > 0
    assert driver.worker.forwards > 0 and driver.sched.tree_cache is driver.tree_cache


def test_priority_evicts_rejects_and_times_out_as_sglang_does(release):
    driver = drive(release, scheduler_workloads.Priority(c=4, seed=0))
    status = {o.rid: o.status for o in driver.outcomes}
    why = {o.rid: o.why for o in driver.outcomes}
    assert collections.Counter(status.values()) == {FINISHED: 8, REJECTED: 3, TIMED_OUT: 1}
    evicted = [r for r, w in why.items() if "higher priority" in w]
    assert len(evicted) == 2 and all(r.endswith("-queued") for r in evicted)
    assert "queue is full" in why["conv0-t0-full"] and status["conv0-t0-lowest"] == TIMED_OUT
    assert all(status[f"conv{i}-t0-high"] == FINISHED for i in range(2))


def test_a_request_is_aborted_at_each_stage(release):
    workload = scheduler_workloads.AbortStages(c=5, seed=0)
    driver = drive(release, workload)
    status = {o.rid: o.status for o in driver.outcomes}
    stages = {rid.rsplit("-", 1)[1]: s for rid, s in status.items() if not rid.endswith("-ok")}
    assert stages == {
        "arrival": ABORTED_IN_QUEUE,
        "queued": ABORTED_IN_QUEUE,
        "chunked": ABORTED,
        "decoding": ABORTED,
        "retracted": ABORTED_IN_QUEUE,
    }
    assert all(status[f"conv{i}-t0-ok"] == FINISHED for i in range(5))


def test_a_scheduler_that_stops_admitting_is_reported_and_the_run_ends(release):
    """Up to 0.5.21 ``batch_is_full`` stays set over an empty running batch; 0.5.22
    clears it (docs/real-bugs.json ``sglang-admission-stall-empty-batch``)."""
    workload = scheduler_workloads.SessionPressure(c=2, seed=0)
    record = record_run(release, workload, turns=2, warmup=1)
    found = [f for t in record.turns for p in t.probes for f in p.findings]
    starved = [f for f in found if f.kind == FindingKind.STARVED]
    assert record.error is None
    if Version(release.version) >= Version(STALL_FIXED):
        assert not starved and len(record.turns) == 2, found
        return
    assert starved and "request short-t0" in starved[0].detail, found
    assert "batch_is_full=True" in starved[0].detail


def test_sglangs_own_idle_check_runs_and_sees_a_planted_leak(release):
    """SGLang's memory check at idle runs as shipped: silent after a clean load, and
    it reports three KV tokens taken from the allocator behind the scheduler's back."""

    def plant(driver):
        driver.step()  # idle: the check runs
        clean = driver.own_reports()
        driver.sched.token_to_kv_pool_allocator.alloc(3)
        driver.step()
        return clean, driver.own_reports()

    clean, leaked = drive(release, scheduler_workloads.AbortStages(c=2, seed=0), then=plant)
    assert clean == [], clean
    assert leaked and "leak" in leaked[0].lower(), leaked
