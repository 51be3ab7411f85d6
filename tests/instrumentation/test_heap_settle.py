"""A heap snapshot never holds a batch of spans half-written by the exporter's thread.

The span file is written off the engine thread, in batches. A snapshot taken
while a batch is being written counts that batch's strings as live memory in
kvwatch's own code; after a run they look left over, and the heap detector
reads them as a leak. The server's sampler lets the batch finish first
(``Telemetry.write_spans`` as the tracker's ``settle``).

The exporter's file here blocks inside ``write`` until the test lets it go, so
a batch is in flight at a moment the test picks, on any machine.
"""

from __future__ import annotations

import threading
import tracemalloc

import pytest

from kvwatch.instrumentation.heap_tracker import HeapTracker
from kvwatch.instrumentation.providers import Telemetry
from kvwatch.instrumentation.spanfile import SpanFileExporter

EXPORT = SpanFileExporter.export.__code__
# the export's own lines: the exporter's file and lock, made once, are not a batch
EXPORT_SITES = {f"{EXPORT.co_filename}:{line}" for _, _, line in EXPORT.co_lines() if line}
SPANS = 40


class HeldFile:
    """A text file whose ``write`` waits for ``release``; ``writing`` is set once
    a write has started."""

    def __init__(self, file) -> None:
        self.file, self.writing, self.release = file, threading.Event(), threading.Event()

    def write(self, text: str) -> int:
        self.writing.set()
        self.release.wait(60)
        return self.file.write(text)

    def __getattr__(self, name):
        return getattr(self.file, name)


def _in_flight_bytes(sample: dict) -> int:
    return sum(size for site, size in sample["by_site"].items() if site in EXPORT_SITES)


def _batch_in_flight(tmp_path, settle: bool) -> tuple[int, Telemetry, HeldFile]:
    telemetry = Telemetry(run_dir=tmp_path)
    exporter = telemetry._span_file_processor._batch_processor._exporter
    held = exporter._file = HeldFile(exporter._file)
    tracer = telemetry.tracer
    for i in range(SPANS):
        with tracer.start_as_current_span(f"request {i}") as span:
            span.set_attribute("prompt", "x" * 200)
    # the processor's own thread writes the batch, as in a server
    threading.Thread(target=telemetry.tracer_provider.force_flush, daemon=True).start()
    assert held.writing.wait(60), "the exporter's thread never wrote"

    def let_it_finish() -> None:
        held.release.set()
        telemetry.write_spans()

    tracker = HeapTracker({}, settle=let_it_finish if settle else None)
    # every site: in a worker that ran other tests first, the batch may rank below a top 200
    sample = tracker.sample(sites=1_000_000)
    held.release.set()
    return _in_flight_bytes(sample), telemetry, held


@pytest.fixture
def tracing():
    tracemalloc.stop()  # a fresh trace: nothing an earlier test in this process left traced
    tracemalloc.start(4)
    try:
        yield
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("settle", [False, True], ids=["unsettled", "settled"])
def test_a_snapshot_sees_a_half_written_batch_only_without_settling(tmp_path, tracing, settle):
    left, telemetry, _ = _batch_in_flight(tmp_path, settle)
    try:
        if settle:
            assert left == 0  # the batch was written before the snapshot
        else:
            assert left > SPANS * 200  # the joined batch, alive in the exporter's thread
    finally:
        telemetry.shutdown()
    lines = (tmp_path / "spans.jsonl").read_text().splitlines()
    assert len(lines) == SPANS  # every span written either way
