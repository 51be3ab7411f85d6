"""Nothing kvwatch allocates for a request lives as long as its idle connection.

uvicorn keeps a keep-alive connection's last ASGI scope until the connection's
next request or its close (``KEEP_ALIVE_S``, 75 s). State a handler or
middleware keeps in the scope then outlives its request by that long, once per
open connection: a load generator that keeps many connections open at the heap
barrier (a fast machine ends its runs before they idle out) shows it as a site
that kept an allocation per request. Here every request is answered on a
connection of its own that stays open while the heap is sampled (after a
flush, as the gate's drain does): no kvwatch site may have kept anything per
request.
"""

from __future__ import annotations

import httpx
import pytest
from inprocserver import serving

from kvwatch.serve import ServeOptions, build
from kvwatch.server import ServerSettings

pytestmark = pytest.mark.slow

REQUESTS = 32


@pytest.mark.parametrize("stream", [False, True])
def test_open_keep_alive_connections_keep_no_kvwatch_allocation(stream):
    app, _, telemetry = build(ServeOptions(settings=ServerSettings(enable_probe=True)))
    clients: list[httpx.Client] = []
    try:
        with serving(app) as url, httpx.Client(base_url=url, timeout=120) as ctl:
            assert ctl.post("/debug/tracemalloc/start").status_code == 200
            assert ctl.post("/debug/tracemalloc/mark", params={"scope": "kvwatch"}).is_success
            for i in range(REQUESTS):
                client = httpx.Client(base_url=url, timeout=120)
                clients.append(client)
                body = {
                    "model": "kvwatch-tiny-hybrid",
                    "prompt": f"request {i}: say something",
                    "max_tokens": 4,
                    "stream": stream,
                }
                resp = client.post("/v1/completions", json=body)
                assert resp.status_code == 200, resp.text
            # as the gate's drain does: what the prefix cache keeps is not kept per request
            assert ctl.post("/debug/flush_cache").is_success
            snap = ctl.get(
                "/debug/tracemalloc/snapshot", params={"scope": "kvwatch", "sites": 50}
            ).json()
    finally:
        for client in clients:
            client.close()
        telemetry.shutdown()
    sites = snap["since_mark"]
    assert sites, snap  # the sample is there to read
    kept = [s for s in sites if s["count_diff"] >= REQUESTS]
    assert kept == [], kept
