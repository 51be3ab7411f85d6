"""Every panel's PromQL, run through a real Prometheus, returns data.

    kvwatch serve (forced retraction) ◄── scrape 1 s ── Prometheus ── scrape ──► Pushgateway
          ▲ openai client: shared-prefix chats, a session,                           ▲
          │ streams cut mid-decode, 4 at a time                                      │
    kvwatch gate --profile rl-rollout --inject session-blob-retention --pushgateway ─┘
                 --grafana-url <fake Grafana>   (annotations at the finding's turn)

Template variables are resolved the way Grafana's Prometheus datasource does
(``label_values`` through ``/api/v1/label/<name>/values``), a repeated panel
is queried once per value, and ``$__rate_interval`` becomes 10 s (4 scrape
intervals and then some). Range panels are queried over the load; instant
ones at the end.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import httpx
import openai
import pytest
from fakegrafana import fake_grafana
from promstack import (
    SCRAPE_INTERVAL_S,
    PromStack,
    api,
    finite_values,
    panel_queries,
    prometheus_stack,
    variable_values,
)
from serverproc import TOKEN, kvwatch_server

from kvwatch.dashboards import build

pytestmark = pytest.mark.e2e

RATE_INTERVAL = "10s"
LOAD_SECONDS = 8.0
SYSTEM = "You are the planning agent. Tools: search, read_file, write_file, run_tests. " * 4
# panels that must show more than zeros after this load
MOVING = {
    ("kvwatch-pools", "Pages by owner: $group"),
    ("kvwatch-pools", "Session-held pages"),
    ("kvwatch-pools", "Used against capacity: $group"),
    ("kvwatch-serving", "Time to first token"),
    ("kvwatch-serving", "Time per output token"),
    ("kvwatch-serving", "Throughput"),
    ("kvwatch-serving", "Prefix hit rate"),
    ("kvwatch-serving", "Retractions"),
    ("kvwatch-serving", "Aborts by stage"),
    ("kvwatch-leak-gate", "Gate verdict"),
    ("kvwatch-leak-gate", "Failing detector runs"),
    ("kvwatch-leak-gate", "First failing turn"),
    ("kvwatch-leak-gate", "Heap bytes per held token, by turn"),
}


class Run(NamedTuple):
    stack: PromStack
    load_start: float
    gate_code: int
    summary: dict
    annotations: list[dict]


def chat_load(url: str, stop_at: float) -> None:
    """Shared-prefix chats, a streamed reply cut after two chunks, a session turn."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    sid = httpx.post(f"{url}/v1/sessions", json={}, timeout=300).json()["id"]
    i = 0
    while time.time() < stop_at:
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"step {i}"},
        ]
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=24)
        stream = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=64, stream=True
        )
        for n, _ in enumerate(stream):
            if n == 2:
                stream.close()  # the client hangs up mid-decode: an abort
                break
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": f"session turn {i}"}],
            max_tokens=8,
            extra_body={"session_id": sid},
        )
        i += 1
    httpx.delete(f"{url}/v1/sessions/{sid}", timeout=300)


def wait_for(stack: PromStack, query: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not api(stack, "query", query=query)["result"]:
        if time.monotonic() > deadline:
            raise AssertionError(f"Prometheus never saw {query}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Run:
    work = tmp_path_factory.mktemp("prometheus")
    engine = work / "engine.json"
    engine.write_text(json.dumps({"scheduler": {"retract_every": 6, "retract_backoff": 16}}))
    flags = ("--enable-probe", "--probe-token", TOKEN, "--config", str(engine))
    with (
        kvwatch_server(*flags) as url,
        prometheus_stack([url.removeprefix("http://")], work) as stack,
        fake_grafana() as (grafana, fake),
    ):
        load_start = time.time()
        with ThreadPoolExecutor(4) as pool:
            for f in [pool.submit(chat_load, url, load_start + LOAD_SECONDS) for _ in range(4)]:
                f.result()
        out = work / "gate"
        gate = subprocess.run(
            [
                sys.executable,
                "-m",
                "kvwatch",
                "gate",
                "--profile",
                "rl-rollout",
                "-c",
                "1",
                "--inject",
                "session-blob-retention",
                "--out",
                str(out),
                "--no-report",
                "--pushgateway",
                stack.pushgateway,
                "--grafana-url",
                grafana,
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        wait_for(stack, "kvwatch_gate_heap_bytes_per_held_token")
        # two more scrapes of the engine after the load, however long the gate took
        wait_for(stack, f'timestamp(up{{job="kvwatch"}}) > {time.time() + SCRAPE_INTERVAL_S}')
        summary = json.loads((out / "summary.json").read_text())
        yield Run(stack, load_start, gate.returncode, summary, list(fake.annotations))


def test_the_gate_pushed_its_verdict_and_annotated_the_finding(run):
    assert run.gate_code == 1, run.summary
    assert run.summary["published"]["pushgateway"] == "pushed"
    (gate_run,) = run.summary["runs"]
    heap = gate_run["detectors"]["heap"]
    assert heap["verdict"] == "fail"
    at = {p["turn"]: p["at"] for p in gate_run["timeline"]}
    (finding,) = [a for a in run.annotations if "leak" in a["tags"]]
    assert "heap" in finding["tags"]
    assert finding["time"] == round(at[heap["first_turn"]] * 1000)
    assert run.summary["published"]["grafana"] == f"{len(run.annotations)} annotations"


@pytest.mark.parametrize("uid", list(build.DASHBOARDS))
def test_every_panel_query_returns_data(run, uid):
    model = build.models()[uid]
    values = variable_values(model, run.stack)
    assert values.get("instance"), "the engine's instance is not among $instance's values"
    empty, moved = [], set()
    checked = 0
    for title, value, target, expr in panel_queries(model, values, RATE_INTERVAL):
        if target.get("instant"):
            data = api(run.stack, "query", query=expr)
        else:
            data = api(
                run.stack,
                "query_range",
                query=expr,
                start=run.load_start - 5,
                end=time.time(),
                step="1",
            )
        found = finite_values(data)
        checked += 1
        if not found:
            empty.append(f"{title} [{value}]: {expr}")
        elif any(v > 0 for v in found):
            moved.add(title)
    assert checked >= 10
    assert empty == [], "\n".join(empty)
    still = {title for u, title in MOVING if u == uid} - moved
    assert not still, f"only zeros after the load: {sorted(still)}"
