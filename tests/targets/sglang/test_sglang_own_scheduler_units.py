"""The own-scheduler driver's parts that run without an SGLang wheel.

Which driver a release's files choose, the virtual clock and in-memory
sockets, the release's ``ServerArgs`` with its defaults, a release function
compiled from source, the paced event loop (one iteration per step, errors
surfaced), the import plan (real modules, plain ``Scheduler*Mixin`` bases),
what the scheduler's outputs mean for a request, the request handle, the
admission watch, and the probe's reading of a free group. The runs on the
releases themselves are in ``test_sglang_engine_decides.py`` and
``test_sglang_own_scheduler_live.py``.
"""

from __future__ import annotations

import dataclasses
import threading
from types import SimpleNamespace

import pytest
import torch

from kvwatch.contracts import FindingKind
from kvwatch.targets.sglang import (
    admission_watch,
    loop_choice,
    pool_holders,
    registry_walk,
    runtime_host,
    scheduler_host,
    scheduler_imports,
)
from kvwatch.targets.sglang.loop import SchedulerLoop
from kvwatch.targets.sglang.loop_parts import (
    ABORTED,
    ABORTED_BY_SGLANG,
    ABORTED_IN_QUEUE,
    FINISHED,
    REJECTED,
    TIMED_OUT,
)
from kvwatch.targets.sglang.messages import RequestHandle, ends
from kvwatch.targets.sglang.paced_loop import PacedLoop
from kvwatch.targets.stand_ins import StubModule


# -- which driver -----------------------------------------------------------------------------
def _release_files(root, scheduler: str, common: str = "") -> None:
    srt = root / "sglang" / "srt"
    (srt / "managers").mkdir(parents=True)
    (srt / "mem_cache").mkdir(parents=True)
    (srt / "managers" / "scheduler.py").write_text(scheduler)
    (srt / "mem_cache" / "common.py").write_text(common)


def test_the_release_files_choose_how_the_scheduler_is_built(tmp_path):
    _release_files(tmp_path / "a", "from sglang.srt.server_args import ServerArgs\n")
    assert loop_choice.plan_for(tmp_path / "a") is scheduler_imports.PLAN
    context = "from sglang.srt.runtime_context import get_server_args\n"
    _release_files(tmp_path / "b", context)  # 0.5.16+, however it publishes the context
    assert loop_choice.plan_for(tmp_path / "b") is runtime_host.PLAN
    (tmp_path / "c/sglang/srt").mkdir(parents=True)  # no scheduler at all
    with pytest.raises(loop_choice.Unsupported, match=r"no managers/scheduler\.py"):
        loop_choice.plan_for(tmp_path / "c")


# -- the host's side --------------------------------------------------------------------------
def test_a_release_literal_is_read_from_its_file_or_is_none(tmp_path):
    (tmp_path / "m.py").write_text("CHUNK_SIZE = 64\nWINDOWS = (10, 100)\nOTHER = f(1)\n")
    assert scheduler_host.release_literal(tmp_path, "m.py", "CHUNK_SIZE") == 64
    assert scheduler_host.release_literal(tmp_path, "m.py", "WINDOWS") == (10, 100)
    assert scheduler_host.release_literal(tmp_path, "m.py", "MISSING") is None
    assert scheduler_host.release_literal(tmp_path, "absent.py", "CHUNK_SIZE") is None


def test_the_clock_is_virtual_and_the_sockets_are_queues():
    clock = scheduler_host.Clock(start=10.0)
    module = clock.module()
    clock.advance()
    assert module.perf_counter() == module.time() == module.monotonic() == 11.0
    assert module.perf_counter_ns() == 11_000_000_000 and module.sleep is not None
    inbox, outbox = scheduler_host.InQueue(), scheduler_host.OutSink()
    inbox.messages.append("m")
    assert inbox.recv_pyobj() == "m"
    with pytest.raises(scheduler_imports.ZMQError):
        inbox.recv_pyobj(1)
    outbox.send_pyobj("x")
    assert outbox.sent == ["x"]


def test_server_args_are_the_release_defaults_with_the_run_settings():
    @dataclasses.dataclass
    class ServerArgs:
        page_size: int = 1
        chunked_prefill_size: int | None = None
        tags: list = dataclasses.field(default_factory=lambda: ["a"])

        def __post_init__(self):
            raise AssertionError("a CPU host skips __post_init__")

    args = scheduler_host.server_args(ServerArgs, page_size=4, undeclared=True)
    assert (args.page_size, args.chunked_prefill_size, args.tags) == (4, None, ["a"])
    assert not hasattr(args, "undeclared")


def test_a_release_function_is_compiled_from_its_source(tmp_path):
    (tmp_path / "m.py").write_text("class W:\n    def info(self):\n        return (self.a, 2)\n")
    info = scheduler_host.release_function(tmp_path, "m.py", "info")
    assert info(SimpleNamespace(a=1)) == (1, 2)
    with pytest.raises(LookupError):
        scheduler_host.release_function(tmp_path, "m.py", "other")


def test_stubbed_scheduler_mixins_are_plain_classes():
    module = scheduler_imports.plain_mixins(StubModule("sglang.srt.x"))
    mixin = module.SchedulerProfilerMixin
    assert isinstance(mixin, type) and not hasattr(mixin(), "anything")
    assert not module.SomethingElse  # other names are still stubs
    assert scheduler_imports.PLAN.is_real("sglang.srt.managers.scheduler")
    assert scheduler_imports.PLAN.is_real("sglang.srt.managers.scheduler_components.ipc_channels")
    assert not scheduler_imports.PLAN.is_real("sglang.srt.managers.tp_worker")


# -- the paced loop ---------------------------------------------------------------------------
class _Loop:
    def __init__(self, fail_at: int | None = None):
        self.seen, self.fail_at = [], fail_at

    def recv_requests(self):
        return []

    def event_loop_normal(self):
        while True:
            self.recv_requests()
            self.seen.append(threading.current_thread().name)
            if len(self.seen) == self.fail_at:
                raise ValueError("boom")


def test_one_step_is_one_iteration_of_the_loop_in_its_own_thread():
    fake = _Loop()
    loop = PacedLoop(fake)
    assert fake.seen == []
    loop.step()
    loop.step()
    assert len(fake.seen) == 2 and loop.iterations == 2
    assert threading.current_thread().name not in fake.seen
    loop.stop()
    assert not loop.thread.is_alive()


def test_an_error_in_the_loop_is_raised_by_the_step_that_ran_it():
    loop = PacedLoop(_Loop(fail_at=2))
    loop.step()
    with pytest.raises(ValueError, match="boom"):
        loop.step()
    with pytest.raises(RuntimeError, match="has ended"):
        loop.step()


# -- what the scheduler sends back ------------------------------------------------------------
def test_outputs_name_the_requests_they_end():
    batch = SimpleNamespace(rids=["a", "b", "c"], finished_reasons=[None, {"type": "length"}, None])
    abort = type("AbortReq", (), {"rid": "q", "finished_reason": {"type": "abort"}})()
    assert ends(batch) == [("b", {"type": "length"})]
    assert ends(abort) == [("q", {"type": "abort"})]


@pytest.mark.parametrize(
    "rid, message, where, status",
    [
        ("r1", None, None, FINISHED),
        ("asked", "Abort before prefill", "queue", ABORTED_IN_QUEUE),
        ("asked", "Abort in decode", "running", ABORTED),
        ("r2", "Request waiting timeout reached.", None, TIMED_OUT),
        ("r3", "The request queue is full.", None, REJECTED),
        ("r4", "The request is aborted by a higher priority request.", None, REJECTED),
        ("r5", "Out of memory even after retracting all other requests", None, ABORTED_BY_SGLANG),
    ],
)
def test_an_end_reads_as_its_client_would_hear_it(rid, message, where, status):
    driver = SimpleNamespace(
        asked_to_abort=lambda r: r == "asked", where_asked={"asked": where} if where else {}
    )
    reason = {"type": "length"} if message is None else {"type": "abort", "message": message}
    assert SchedulerLoop._status(driver, rid, reason) == status


def test_a_handle_reads_the_request_once_the_scheduler_made_it():
    handle = RequestHandle("r", [5, 6], 4)
    assert handle.origin_input_ids == [5, 6] and handle.output_ids == []
    assert handle.sampling_params.max_new_tokens == 4 and handle.finished_reason is None
    with pytest.raises(AttributeError, match="never reached the scheduler"):
        _ = handle.kv_committed_len
    handle.req = SimpleNamespace(origin_input_ids=[5, 6], output_ids=[9], kv_committed_len=2)
    assert handle.output_ids == [9] and handle.kv_committed_len == 2


# -- the admission watch ----------------------------------------------------------------------
class _Batch:
    def __init__(self, n=0, full=False):
        self.reqs, self.batch_is_full = [object()] * n, full

    def is_empty(self):
        return not self.reqs


def _driver(waiting, free=100, running=0):
    pools = SimpleNamespace(
        allocator=SimpleNamespace(available_size=lambda: free, size=128),
        req_to_token_pool=SimpleNamespace(free_slots=[1, 2]),
        mamba_slots=None,
        config=SimpleNamespace(page_size=1),
    )
    tree = SimpleNamespace(evictable_size=lambda: 0)
    return SimpleNamespace(
        waiting_queue=waiting,
        running_batch=_Batch(running, full=True),
        chunked_req=None,
        pools=pools,
        tree_cache=tree,
    )


def _req(rid, prompt, new=4, session=None):
    params = SimpleNamespace(max_new_tokens=new)
    return SimpleNamespace(
        rid=rid,
        origin_input_ids=[0] * prompt,
        output_ids=[],
        sampling_params=params,
        session=session,
    )


def test_a_queue_nothing_admits_stalls_and_a_request_that_fits_is_a_finding():
    watch = admission_watch.AdmissionWatch(bound=3)
    driver = _driver([_req("short", 4), _req("next", 4)])
    for _ in range(2):
        watch.observe(driver, ran_batch=False)
    assert not watch.stalled and watch.findings() == []
    watch.observe(driver, ran_batch=False)
    assert watch.stalled
    (found,) = watch.findings()
    assert found.kind == FindingKind.STARVED and found.group == "sglang.kv"
    assert "request short (4 prompt, 4 new tokens)" in found.detail
    assert "batch_is_full=True" in found.detail and "also waiting: next" in found.detail
    watch.observe(driver, ran_batch=True)  # a batch ran: the count starts again
    assert not watch.stalled and watch.findings() == []


def test_a_first_request_no_idle_engine_fits_stalls_without_a_finding():
    watch = admission_watch.AdmissionWatch(bound=2)
    for waiting in ([_req("big", 200)], [_req("turn", 4, session=object())]):
        driver = _driver(waiting)
        for _ in range(2):
            watch.observe(driver, ran_batch=False)
        assert watch.stalled and watch.findings() == []
        watch.observe(_driver([]), ran_batch=False)
    running = _driver([_req("short", 4)], running=1)
    for _ in range(3):
        watch.observe(running, ran_batch=False)
    assert not watch.stalled  # something runs: it will free memory or finish


# -- the probe's reading of a free group ------------------------------------------------------
def test_a_free_group_counts_as_free_only_while_it_is_open():
    pages = torch.tensor([4, 5])
    closed = SimpleNamespace(free_pages=pages, free_group=[pages], is_not_in_free_group=True)
    opened = SimpleNamespace(free_pages=pages[:0], free_group=[pages], is_not_in_free_group=False)
    newer = SimpleNamespace(free_pages=pages[:0], free_group=None)  # 0.5.22+: closed is None
    assert pool_holders.free_units(closed, 1) == [4, 5]
    assert pool_holders.free_units(opened, 1) == [4, 5]
    assert pool_holders.free_units(newer, 1) == []
    allocator = type(
        "TokenToKVPoolAllocator", (), {"__module__": "sglang.srt.mem_cache.allocator"}
    )()
    allocator.free_group, allocator.pending = [pages], [1]
    assert registry_walk.walk({"allocator": allocator}).sizes == {"allocator.pending": 1}
