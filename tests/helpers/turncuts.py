"""A session turn cut at each stage through the server's test controls, in process.

Shared by the combination coverage tests (every turn-abort edge taken) and the
departures oracle's tests (a scripted abort that never lands is found).
"""

from __future__ import annotations

from fastapi.testclient import TestClient

from kvwatch.contracts import FindingKind, ProbeReport
from kvwatch.engine import Engine, EngineConfig
from kvwatch.engine.overrides import apply_overrides
from kvwatch.instrumentation import combos
from kvwatch.instrumentation.combo_counter import CombinationCounter
from kvwatch.instrumentation.coverage import coverage
from kvwatch.server import EngineWorker, ServerSettings, create_app

MODEL = ServerSettings().model_name

CUT = {
    "queued": {"abort_in": "queued"},
    "prefilling": {"abort_in": "prefilling"},
    "decoding": {"abort_in": "decoding"},
    "verifying": {"abort_in": "verifying"},
    "retracted": {"retract_after": 8, "hold_steps": 100_000, "abort_in": "retracted"},
    "paused": {"pause_after_output": 2, "hold_steps": 100_000, "abort_in": "paused"},
    "recovering": {"retract_after": 8, "hold_steps": 2, "abort_in": "recovering"},
}


def cut_turns(stages) -> tuple[dict, dict[str, str], list[str]]:
    """A session turn cut at each of ``stages`` through the server's test controls:
    the turn-abort coverage the counter saw, each turn's finish reason, and the
    ``abandoned`` findings the probes carried."""
    config = {"scheduler": {"chunk_size": 48, "max_batch_tokens": 96, "spec": {"num_drafts": 6}}}
    engine = Engine(apply_overrides(EngineConfig(), config))
    counter = CombinationCounter(engine.events, page=16, window=32)
    worker = EngineWorker(engine)
    first = [
        {"role": "system", "content": "pool page tree " * 12},
        {"role": "user", "content": "hi"},
    ]
    reasons, abandoned = {}, []
    with TestClient(create_app(worker, ServerSettings(enable_probe=True))) as client:
        for stage in stages:
            sid = client.post("/v1/sessions", json={}).json()["id"]
            body = {"model": MODEL, "max_tokens": 8, "temperature": 0, "session_id": sid}
            assert client.post("/v1/chat/completions", json={**body, "messages": first}).is_success
            second = [{"role": "user", "content": "slot window state " * 12}]
            body |= {"messages": second, "kvwatch": CUT[stage]}
            done = client.post("/v1/chat/completions", json=body).json()
            reasons[stage] = done["choices"][0]["finish_reason"]
            assert client.delete(f"/v1/sessions/{sid}").is_success
            probe = ProbeReport.from_json(client.get("/debug/probe").json())
            abandoned += [f.detail for f in probe.findings if f.kind is FindingKind.ABANDONED]
    return coverage(counter.taken())[combos.TURN_ABORT], reasons, abandoned
