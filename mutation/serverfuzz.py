"""The server program: seeded random traffic through the real app, in process.

Chat and text completions (greedy, seeded and unseeded sampling, streamed and
not), session turns, rollbacks and closes, requests the engine retracts or pauses
and then resumes or aborts (the ``kvwatch`` test controls), streams read
half-way, and bad
input of every kind, through FastAPI's test client. It observes:

* no answer is a 5xx, and no malformed request gets a 2xx;
* once every session is closed and the cache flushed, every pool is empty
  and every registry the app, its worker, the engine and kvwatch's modules
  hold is back at its size before the traffic (quiescence);
* every comparable request the server finished equals its cache-off replay.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

from fastapi.testclient import TestClient

from kvwatch.engine import Engine
from kvwatch.harness.run_record import Candidate
from kvwatch.instrumentation.registries import module_roots, registry_sizes
from kvwatch.server import ServerSettings, create_app
from kvwatch.server.worker import EngineWorker
from kvwatch.targets.kvwatch.replay import Reference
from mutation.fuzz import SETUPS, Observation, Program

MODEL = ServerSettings().model_name
WORDS = ["plan", "tool", "read", "file", "diff", "test", "ok", "next", "run", "fix"]
BAD = [
    ("/v1/chat/completions", b"{not json"),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": -1},
    ),
    ("/v1/completions", {"model": MODEL, "prompt": [1, 2, 10**9]}),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "session_id": "no-such-session"}),
    ("/v1/sessions/no-such-session/rollback", {"steps": 1}),
]
PROGRAMS = (Program("radix-pressure", 0, 40), Program("slots", 1, 30))


class _Traffic:
    def __init__(self, program: Program, client: TestClient) -> None:
        self.program, self.client = program, client
        self.rng = random.Random(program.seed)
        self.sessions: dict[str, str] = {}  # id -> text so far
        self.seen: list[Observation] = []

    def _text(self, most: int = 12) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(1, most)))

    def _check(self, what: str, status: int, *, bad: bool = False) -> None:
        if status >= 500 or (bad and status < 400):
            self.seen.append(Observation(self.program, "failure", f"{what}: HTTP {status}"))

    def _sampling(self) -> dict:
        kind = self.rng.choice(["greedy", "greedy", "seeded", "free"])
        out = {"model": MODEL, "max_tokens": self.rng.randint(1, 8)}
        out["temperature"] = 0.0 if kind == "greedy" else 0.9
        if kind == "seeded":
            out["seed"] = self.rng.randint(0, 99)
        return out

    def chat(self) -> None:
        system = {"role": "system", "content": "shared system prompt for every agent"}
        body = {**self._sampling(), "messages": [system, {"role": "user", "content": self._text()}]}
        if self.rng.random() < 0.25:
            how, after, held = self.rng.choice(
                [("retract_after", 2, "retracted"), ("pause_after_output", 1, "paused")]
            )
            body["kvwatch"] = {how: after, "hold_steps": 3}
            if self.rng.random() < 0.5:
                body["kvwatch"]["abort_in"] = self.rng.choice([held, "recovering"])
        if self.rng.random() < 0.4:
            body["stream"] = True
            with self.client.stream("POST", "/v1/chat/completions", json=body) as r:
                self._check("stream", r.status_code)
                for i, _ in enumerate(r.iter_lines()):
                    if i == 2 and self.rng.random() < 0.5:
                        break  # the reader goes away half-way
            return
        self._check("chat", self.client.post("/v1/chat/completions", json=body).status_code)

    def completion(self) -> None:
        body = {**self._sampling(), "prompt": "the shared prefix " + self._text()}
        self._check("completion", self.client.post("/v1/completions", json=body).status_code)

    def session(self) -> None:
        if len(self.sessions) < 2 and (not self.sessions or self.rng.random() < 0.3):
            r = self.client.post("/v1/sessions", json={"record": self.rng.random() < 0.5})
            self._check("open session", r.status_code)
            if r.status_code == 200:
                self.sessions[r.json()["id"]] = ""
            return
        sid = self.rng.choice(sorted(self.sessions))
        roll = self.rng.random()
        if roll < 0.15:
            self._check("close", self.client.delete(f"/v1/sessions/{sid}").status_code)
            del self.sessions[sid]
        elif roll < 0.3 and self.sessions[sid]:
            r = self.client.post(f"/v1/sessions/{sid}/rollback", json={"steps": 1})
            self._check("rollback", r.status_code)  # a 400 (nothing to roll back) is an answer
            if r.status_code == 200:  # what the session's tokens are now is the server's word
                self.sessions[sid] = None
        else:
            if self.sessions[sid] is None:
                return
            text = self.sessions[sid] + " " + self._text(6)
            body = {"model": MODEL, "prompt": text, "max_tokens": 4, "temperature": 0.0}
            r = self.client.post("/v1/completions", json={**body, "session_id": sid})
            self._check("session turn", r.status_code)
            if r.status_code == 200:
                self.sessions[sid] = text + r.json()["choices"][0]["text"]

    def bad(self) -> None:
        path, body = self.rng.choice(BAD)
        kw = {"content": body} if isinstance(body, bytes) else {"json": body}
        self._check(f"bad input to {path}", self.client.post(path, **kw).status_code, bad=True)

    OPERATIONS = ((chat, 5), (completion, 3), (session, 3), (bad, 1))

    def run(self) -> None:
        ops, weights = zip(*self.OPERATIONS, strict=True)
        for _ in range(self.program.operations):
            self.rng.choices(ops, weights)[0](self)
        for sid in sorted(self.sessions):
            self._check("close", self.client.delete(f"/v1/sessions/{sid}").status_code)


DRAIN_S = 60  # the engine ends what cut streams left running; a busy machine is slow


def _drained(worker: EngineWorker) -> bool:
    """Whether the engine ran out of live requests within ``DRAIN_S`` seconds: an
    aborted stream is ended by the engine after its client has gone, so the traffic's
    last call can return before its request does (the flush would answer 409)."""
    deadline = time.monotonic() + DRAIN_S
    while worker.call(worker.engine.has_unfinished).result(60):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def run(program: Program) -> list[Observation]:
    """One program's traffic, then the end-state oracles."""
    config = SETUPS[program.setup]
    worker = EngineWorker(Engine(config))
    app = create_app(worker, ServerSettings(enable_probe=True))
    state = app.state  # RequestLimits passes attributes through to the FastAPI app

    def sizes() -> dict[str, int]:
        roots = {**state._state, **module_roots()}
        return worker.call(lambda: registry_sizes(roots)).result(60)

    with TestClient(app) as client:
        client.get("/debug/finished")
        before = sizes()
        traffic = _Traffic(program, client)
        traffic.run()
        seen = traffic.seen
        if not _drained(worker):
            return [*seen, Observation(program, "drain", f"requests still live {DRAIN_S} s on")]
        flush = client.post("/debug/flush_cache")
        if flush.status_code != 200:
            return [*seen, Observation(program, "drain", f"flush answered {flush.status_code}")]
        report = worker.call(worker.engine.probe).result(60)
        after = sizes()
        finished = client.get("/debug/finished").json()["requests"]
    seen += _quiescence(program, report, before, after)
    seen += _equivalence(program, config, finished)
    return seen


def _quiescence(program, report, before, after) -> Iterator[Observation]:
    for finding in report.findings:
        yield Observation(program, "audit", f"after the flush: {finding}")
    for name, group in report.groups.items():
        host = group.by_owner.get("host", 0)
        if group.free != group.capacity or host:
            detail = f"{name}: {group.used} device and {host} host pages held after the flush"
            yield Observation(program, "quiescence", detail)
    for path, size in sorted(after.items()):
        if size != before.get(path, 0):
            detail = f"{path} holds {size} entries, {before.get(path, 0)} before the traffic"
            yield Observation(program, "quiescence", detail)


def _equivalence(program, config, finished) -> Iterator[Observation]:
    candidates = [Candidate.from_finished(0, f) for f in finished]
    for r in Reference(config).replay(candidates):
        if r.cached != r.reference:
            detail = (
                f"{len(r.prompt)}-token prompt: {list(r.cached)} != cache-off {list(r.reference)}"
            )
            yield Observation(program, "equivalence", detail)
