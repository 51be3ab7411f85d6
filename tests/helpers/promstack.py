"""A real Prometheus and Pushgateway (Debian packages) on loopback, for tests.

``prometheus_stack(targets)`` writes a temporary config that scrapes each
target every second, plus the Pushgateway with ``honor_labels`` (so the
gate's ``job`` label survives), starts both binaries on free ports with a
temporary data directory, and waits until Prometheus is ready. Neither
binary can bind port 0 and say which port it got, so a port taken in the
meantime by another process is met by starting again on other ports.

Where the binaries are missing the tests skip with the reason, unless
``KVWATCH_REQUIRE_PROMETHEUS=1`` (CI sets it): then they fail.

``variable_values``, ``fill`` and ``panel_queries`` turn a dashboard model's
panels into the PromQL Grafana would send: template variables resolved the
way its Prometheus datasource does, ``$__rate_interval`` as the caller says.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import httpx
import pytest

from kvwatch.processes import free_port

REQUIRE_ENV = "KVWATCH_REQUIRE_PROMETHEUS"
SCRAPE_INTERVAL_S = 1
READY_TIMEOUT_S = 120  # a loaded machine starts Prometheus slowly; only a hang gets here
START_TRIES = 3


class PromStack(NamedTuple):
    prometheus: str  # base URL
    pushgateway: str


def binaries() -> tuple[str, str]:
    found = [shutil.which(b) for b in ("prometheus", "prometheus-pushgateway")]
    if all(found):
        return found[0], found[1]
    reason = (
        "prometheus and prometheus-pushgateway are not installed "
        "(Debian packages; `make test` installs them where it runs as root with apt-get)"
    )
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {reason}")
    pytest.skip(reason)


def _config(targets: list[str], pushgateway: str) -> str:
    lines = [
        "global:",
        f"  scrape_interval: {SCRAPE_INTERVAL_S}s",
        f"  evaluation_interval: {SCRAPE_INTERVAL_S}s",
        "scrape_configs:",
        "  - job_name: kvwatch",
        "    static_configs:",
        f"      - targets: [{', '.join(repr(t) for t in targets)}]",
        "  - job_name: pushgateway",
        "    honor_labels: true",
        "    static_configs:",
        f"      - targets: ['{pushgateway}']",
    ]
    return "\n".join(lines) + "\n"


class Exited(RuntimeError):
    """The binary exited before it was ready (a port taken since it was picked, say)."""


def _wait(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Exited(f"{proc.args[0]} exited: {log.read_text()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=10).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} was not ready in {READY_TIMEOUT_S} s")


def _started(
    cmd: Callable[[str], list[str]], ready: str, log: Path
) -> tuple[subprocess.Popen, str]:
    """``cmd(address)`` listening on a free loopback port; the process and its address."""
    for attempt in range(START_TRIES):
        address = f"127.0.0.1:{free_port()}"
        with log.open("w") as out:
            proc = subprocess.Popen(cmd(address), stdout=out, stderr=subprocess.STDOUT)
        try:
            _wait(f"http://{address}{ready}", proc, log)
            return proc, address
        except Exited:
            if attempt == START_TRIES - 1:
                raise
        except BaseException:
            _stop(proc)
            raise
    raise AssertionError("unreachable")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def prometheus_stack(targets: list[str], workdir: Path) -> Iterator[PromStack]:
    """Prometheus scraping ``targets`` (host:port) and a Pushgateway, for the block."""
    prometheus, gateway = binaries()
    config = workdir / "prometheus.yml"
    procs = []
    try:
        proc, gateway_addr = _started(
            lambda address: [gateway, f"--web.listen-address={address}"],
            "/-/ready",
            workdir / "pushgateway.log",
        )
        procs.append(proc)
        config.write_text(_config(targets, gateway_addr))
        proc, prom_addr = _started(
            lambda address: [
                prometheus,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address={address}",
            ],
            "/-/ready",
            workdir / "prometheus.log",
        )
        procs.append(proc)
        yield PromStack(f"http://{prom_addr}", f"http://{gateway_addr}")
    finally:
        for proc in procs:
            _stop(proc)


def api(stack: PromStack, path: str, **params) -> object:
    """``GET /api/v1/<path>``; the ``data`` of a successful answer."""
    r = httpx.get(f"{stack.prometheus}/api/v1/{path}", params=params, timeout=300)
    body = r.json()
    if r.status_code != 200 or body.get("status") != "success":
        raise AssertionError(f"{path} {params}: {r.status_code} {body}")
    return body["data"]


def finite_values(data: dict) -> list[float]:
    """Every finite value in a query answer (matrix or vector)."""
    out = []
    for series in data["result"]:
        points = series.get("values") or [series["value"]]
        out += [float(v) for _, v in points if math.isfinite(float(v))]
    return out


def variable_values(model: dict, stack: PromStack) -> dict[str, list[str]]:
    """Each query variable's values, as Grafana finds them (``label_values`` through
    ``/api/v1/label/<name>/values``, later variables filtered by earlier ones)."""
    values: dict[str, list[str]] = {}
    for var in model["templating"]["list"]:
        if var["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"])
        assert match, var["query"]
        series, label = match.groups()
        found = api(stack, f"label/{label}/values", **{"match[]": fill(series, values)})
        assert found, f"${var['name']} ({var['query']}) has no values"
        values[var["name"]] = found
    return values


def fill(expr: str, values: dict[str, list[str]], rate_interval: str = "10s") -> str:
    """Grafana's interpolation: values regex-escaped (the backslash doubled inside a
    PromQL string), several of them as an alternation; ``$__rate_interval`` as given."""
    expr = expr.replace("$__rate_interval", rate_interval)
    for name in sorted(values, key=len, reverse=True):
        choice = "|".join(re.escape(v).replace("\\", "\\\\") for v in values[name])
        expr = expr.replace(f"${name}", f"({choice})" if len(values[name]) > 1 else choice)
    return expr


def panel_queries(model: dict, values: dict[str, list[str]], rate_interval: str = "10s"):
    """(panel title, repeat value, target, PromQL) with the variables filled in; a
    repeated panel once per value of its variable."""
    for panel in model["panels"]:
        repeat = panel.get("repeat")
        for value in values[repeat] if repeat else [None]:
            scoped = {**values, repeat: [value]} if repeat else values
            for target in panel.get("targets", ()):
                yield panel["title"], value, target, fill(target["expr"], scoped, rate_interval)
