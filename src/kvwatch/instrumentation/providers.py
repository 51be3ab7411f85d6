"""Telemetry: the OTel providers kvwatch owns, and where their data goes.

* metrics: a Prometheus reader on a private registry (rendered at
  ``/metrics``), plus an OTLP/HTTP exporter when ``OTEL_EXPORTER_OTLP_ENDPOINT``
  is set, plus any reader a caller adds (tests use ``InMemoryMetricReader``);
* traces: a JSON-lines span file when a run directory is given (written in
  batches off the engine thread, flushed by ``shutdown``), OTLP/HTTP when the
  endpoint is set, plus any span processor a caller adds.

The meter provider carries the latency histograms' bucket views
(``buckets.views()``), so every reader above aggregates with the same bounds
in seconds.

Providers are private to a ``Telemetry`` (never set as the global ones), so
several engines in one process keep their numbers apart.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from kvwatch import __version__
from kvwatch.instrumentation import buckets, names
from kvwatch.instrumentation.spanfile import SpanFileExporter

OTLP_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
SPAN_FILE = "spans.jsonl"
SPAN_FILE_DELAY_MS = 1000


class Telemetry:
    def __init__(
        self,
        *,
        service_name: str = "kvwatch",
        run_dir: str | Path | None = None,
        metric_readers: Sequence[MetricReader] = (),
        span_processors: Sequence[SpanProcessor] = (),
        otlp: bool | None = None,
    ) -> None:
        otlp = bool(os.environ.get(OTLP_ENV)) if otlp is None else otlp
        resource = Resource.create({"service.name": service_name, "service.version": __version__})
        self.registry = CollectorRegistry()
        readers = [PrometheusMetricReader(registry=self.registry), *metric_readers]
        processors = list(span_processors)
        self._span_file_processor: BatchSpanProcessor | None = None
        if run_dir is not None:
            self.span_file = Path(run_dir) / SPAN_FILE
            # Batched: the engine thread only queues a finished span; a worker
            # thread serialises and writes them, about once a second.
            exporter = SpanFileExporter(self.span_file)
            self._span_file_processor = BatchSpanProcessor(
                exporter, schedule_delay_millis=SPAN_FILE_DELAY_MS
            )
            processors.append(self._span_file_processor)
        if otlp:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
            processors.append(BatchSpanProcessor(OTLPSpanExporter()))
        self.meter_provider = MeterProvider(
            metric_readers=readers, resource=resource, views=buckets.views()
        )
        self.tracer_provider = TracerProvider(resource=resource)
        for p in processors:
            self.tracer_provider.add_span_processor(p)
        self.meter = self.meter_provider.get_meter(names.METER, __version__)
        self.tracer = self.tracer_provider.get_tracer(names.TRACER, __version__)

    def render_metrics(self) -> tuple[bytes, str]:
        """The Prometheus page: the exporter's registry in the text format."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def write_spans(self) -> None:
        """Write the span file's queued spans now, waiting for a batch its thread
        is writing: afterwards no batch of it is in flight. (The OTLP exporter is
        left to its own schedule: a collector out of reach must not hold a caller.)"""
        if self._span_file_processor is not None:
            self._span_file_processor.force_flush()

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()
