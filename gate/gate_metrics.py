"""The gate's verdict as metrics, so a dashboard can show it next to the pools.

A gate is a batch job: it ends before anything could scrape it. Its numbers
are built from ``summary.json`` once, as OTel gauges on a private registry,
and then leave in Prometheus' text format (rendered by the exporter, not by
hand) two ways:

* ``OUT/gate.prom``, always, for node_exporter's textfile collector;
* a push to a Pushgateway (``kvwatch gate --pushgateway URL``), grouped under
  ``job="kvwatch-gate"``, replacing what the previous gate pushed.

Series (labels in braces)::

    kvwatch_gate_verdict{verdict}                          1 on the verdict, 0 on the others
    kvwatch_gate_detector_failed{profile,concurrency,detector}   1 fail, 0 pass (skipped: absent)
    kvwatch_gate_detector_first_fail_turn{profile,concurrency,detector}
    kvwatch_gate_run_requests / _errors / _broken{profile,concurrency}
    kvwatch_gate_heap_bytes_per_context_token{profile,concurrency,turn}
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from opentelemetry.metrics import CallbackOptions, Observation
from prometheus_client import generate_latest, push_to_gateway, write_to_textfile

from kvwatch.telemetry import names as n
from kvwatch.telemetry.providers import Telemetry

TEXTFILE = "gate.prom"

Reader = Callable[[Mapping], Iterable[Observation]]


def _run_labels(run: Mapping) -> dict[str, str]:
    return {n.PROFILE: run["profile"], n.CONCURRENCY: str(run["concurrency"])}


def _verdict(summary: Mapping) -> Iterable[Observation]:
    for verdict in n.GATE_VERDICTS:
        yield Observation(int(summary["verdict"] == verdict), {n.VERDICT: verdict})


def _detector_failed(summary: Mapping) -> Iterable[Observation]:
    for run in summary["runs"]:
        for detector, d in run["detectors"].items():
            if d["verdict"] in ("pass", "fail"):
                labels = {**_run_labels(run), n.DETECTOR: detector}
                yield Observation(int(d["verdict"] == "fail"), labels)


def _first_fail_turn(summary: Mapping) -> Iterable[Observation]:
    for run in summary["runs"]:
        for detector, d in run["detectors"].items():
            if d["verdict"] == "fail" and d.get("first_turn") is not None:
                yield Observation(d["first_turn"], {**_run_labels(run), n.DETECTOR: detector})


def _per_run(key: Callable[[Mapping], float]) -> Reader:
    return lambda summary: (Observation(key(r), _run_labels(r)) for r in summary["runs"])


def _heap_per_token(summary: Mapping) -> Iterable[Observation]:
    for run in summary["runs"]:
        for point in run.get("heap_bytes_per_context_token", ()):
            yield Observation(point["value"], {**_run_labels(run), n.TURN: str(point["turn"])})


GAUGES: dict[str, tuple[Reader, str]] = {
    n.GATE_VERDICT: (_verdict, "1"),
    n.GATE_DETECTOR_FAILED: (_detector_failed, "1"),
    n.GATE_FIRST_FAIL_TURN: (_first_fail_turn, "{turn}"),
    n.GATE_RUN_REQUESTS: (_per_run(lambda r: r["requests"]), "{request}"),
    n.GATE_RUN_ERRORS: (_per_run(lambda r: r["errors"]), "{request}"),
    n.GATE_RUN_BROKEN: (_per_run(lambda r: int(bool(r.get("error")))), "1"),
    n.GATE_HEAP_PER_TOKEN: (_heap_per_token, ""),  # bytes per token; a unit would rename it
}


class GateMetrics:
    """One summary's gauges on a private registry; read it, then ``close()``."""

    def __init__(self, summary: Mapping) -> None:
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


def _callback(read: Reader, summary: Mapping):
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        return list(read(summary))

    return callback


def export(summary: Mapping, out: Path, pushgateway: str | None = None) -> dict[str, str]:
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
