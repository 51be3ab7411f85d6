"""The gate's verdict as metrics, so a dashboard can show it next to the pools.

A gate is a batch job: it ends before anything could scrape it. Its numbers
are built from the ``GateSummary`` once, as OTel gauges on a private registry,
and then leave in Prometheus' text format (rendered by the exporter, not by
hand) two ways:

* ``OUT/gate.prom``, always, for node_exporter's textfile collector;
* a push to a Pushgateway (``kvwatch gate --pushgateway URL``), grouped under
  ``job="kvwatch-gate"``, replacing what the previous gate pushed.

Series (labels in braces)::

    kvwatch_gate_verdict{verdict}                          1 on the verdict, 0 on the others
    kvwatch_gate_detector_failed{profile,concurrency,detector}   1 fail or error, 0 pass
                                                           (skipped: absent)
    kvwatch_gate_detector_first_fail_turn{profile,concurrency,detector}
    kvwatch_gate_run_requests / _errors / _broken{profile,concurrency}
    kvwatch_gate_heap_bytes_per_held_token{profile,concurrency,turn}
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from opentelemetry.metrics import CallbackOptions, Observation
from prometheus_client import generate_latest, push_to_gateway, write_to_textfile

from kvwatch.gate.outputs.summary import GateSummary
from kvwatch.gate.verdicts.detectors import ERROR, FAIL, PASS
from kvwatch.gate.verdicts.judge import RunResult
from kvwatch.instrumentation import names as n
from kvwatch.instrumentation.providers import Telemetry

TEXTFILE = "gate.prom"

Reader = Callable[[GateSummary], Iterable[Observation]]


def _run_labels(run: RunResult) -> dict[str, str]:
    return {n.PROFILE: run.profile, n.CONCURRENCY: str(run.concurrency)}


def _verdict(summary: GateSummary) -> Iterable[Observation]:
    for verdict in n.GATE_VERDICTS:
        yield Observation(int(summary.verdict == verdict), {n.VERDICT: verdict})


def _detector_failed(summary: GateSummary) -> Iterable[Observation]:
    for run in summary.runs:
        for detector, v in run.verdicts.items():
            if v.verdict in (PASS, FAIL, ERROR):
                labels = {**_run_labels(run), n.DETECTOR: detector}
                yield Observation(int(v.verdict != PASS), labels)


def _first_fail_turn(summary: GateSummary) -> Iterable[Observation]:
    for run in summary.runs:
        for detector, v in run.failed().items():
            if v.first_turn is not None:
                yield Observation(v.first_turn, {**_run_labels(run), n.DETECTOR: detector})


def _per_run(key: Callable[[RunResult], float]) -> Reader:
    return lambda summary: (Observation(key(r), _run_labels(r)) for r in summary.runs)


def _heap_per_token(summary: GateSummary) -> Iterable[Observation]:
    for run in summary.runs:
        for turn, value in run.heap_per_token:
            yield Observation(round(value, 3), {**_run_labels(run), n.TURN: str(turn)})


GAUGES: dict[str, tuple[Reader, str]] = {
    n.GATE_VERDICT: (_verdict, "1"),
    n.GATE_DETECTOR_FAILED: (_detector_failed, "1"),
    n.GATE_FIRST_FAIL_TURN: (_first_fail_turn, "{turn}"),
    n.GATE_RUN_REQUESTS: (_per_run(lambda r: r.requests), "{request}"),
    n.GATE_RUN_ERRORS: (_per_run(lambda r: r.errors), "{request}"),
    n.GATE_RUN_BROKEN: (_per_run(lambda r: int(bool(r.error))), "1"),
    n.GATE_HEAP_PER_TOKEN: (_heap_per_token, ""),  # bytes per token; a unit would rename it
}


class GateMetrics:
    """One summary's gauges on a private registry; read it, then ``close()``."""

    def __init__(self, summary: GateSummary) -> None:
        self.telemetry = Telemetry(service_name=n.GATE_JOB, otlp=False)
        for name, (read, unit) in GAUGES.items():
            self.telemetry.meter.create_observable_gauge(
                name, [_callback(read, summary)], unit=unit, description=n.HELP[name]
            )

    def text(self) -> bytes:
        return generate_latest(self.telemetry.registry)

    def write(self, path: Path) -> None:
        write_to_textfile(str(path), self.telemetry.registry)

    def push(self, gateway: str, timeout: float = 10.0) -> None:
        """Replace this job's group on the Pushgateway (HTTP PUT)."""
        push_to_gateway(gateway, job=n.GATE_JOB, registry=self.telemetry.registry, timeout=timeout)

    def close(self) -> None:
        self.telemetry.shutdown()


def _callback(read: Reader, summary: GateSummary):
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        return list(read(summary))

    return callback


def export(summary: GateSummary, out: Path, pushgateway: str | None = None) -> dict[str, str]:
    """Write ``OUT/gate.prom``, and push to ``pushgateway`` when given.

    Returns what happened to each (``textfile``: the path; ``pushgateway``:
    ``pushed`` or ``error: ...``). An unreachable gateway is reported here,
    not raised: the verdict stands whether or not it could be published.
    """
    metrics = GateMetrics(summary)
    try:
        path = out / TEXTFILE
        metrics.write(path)
        done = {"textfile": str(path)}
        if pushgateway:
            try:
                metrics.push(pushgateway)
                done["pushgateway"] = "pushed"
            except OSError as exc:
                done["pushgateway"] = f"error: {exc}"
        return done
    finally:
        metrics.close()
