"""Equivalence on every comparable request: greedy and seeded ones, collected from
the server's finished log and replayed on a cache-off engine.

The planted bug corrupts only sampled requests (a seeded draw is shifted by
one token id), which no greedy replay can see; the same traffic without it
passes with every request compared.
"""

from __future__ import annotations

import httpx
import pytest
from inprocserver import serving

from kvwatch.engine import EngineConfig
from kvwatch.engine.runner import ModelRunner
from kvwatch.gate.verdicts.detectors import equivalence
from kvwatch.harness.recorder import RecorderOptions, TurnRecorder
from kvwatch.harness.run_record import Candidate
from kvwatch.harness.sources import HttpSource
from kvwatch.serve import ServeOptions, build
from kvwatch.server import ServerSettings
from kvwatch.targets.kvwatch.replay import Reference

MODEL = "kvwatch-tiny-hybrid"


def _traffic(http: httpx.Client, turn: int) -> None:
    history = [{"role": "system", "content": "you are a careful agent"}]
    for i in range(3):
        history.append({"role": "user", "content": f"turn {turn} step {i}"})
        body = {"model": MODEL, "messages": history, "max_tokens": 4, "temperature": 0}
        greedy = http.post("/v1/chat/completions", json=body)
        assert greedy.status_code == 200, greedy.text
        history.append(greedy.json()["choices"][0]["message"])
        seeded = http.post("/v1/chat/completions", json={**body, "temperature": 1.0, "seed": 7 + i})
        assert seeded.status_code == 200, seeded.text
        unseeded = http.post("/v1/chat/completions", json={**body, "temperature": 1.0})
        assert unseeded.status_code == 200, unseeded.text  # not comparable: not kept


def _recorded(monkeypatch, plant: bool):
    if plant:
        sample = ModelRunner._sample

        def shifted(req, logits):
            token = sample(req, logits)
            return token if req.params.greedy else (token + 1) % logits.shape[-1]

        monkeypatch.setattr(ModelRunner, "_sample", staticmethod(shifted))
    config = EngineConfig()
    app, _, telemetry = build(ServeOptions(settings=ServerSettings(enable_probe=True)), config)
    try:
        with serving(app) as url, httpx.Client(base_url=url, timeout=120) as http:
            recorder = TurnRecorder(HttpSource(url, white_box=True), RecorderOptions(warmup=1))
            recorder.start()
            for turn in range(2):
                _traffic(http, turn)
                recorder.barrier(turn)
            recorder.finish()
    finally:
        telemetry.shutdown()
    monkeypatch.undo()  # the reference must run the engine as written
    run = recorder.record()
    return run._replace(replays=Reference(config).replay(run.candidates))


@pytest.mark.parametrize("plant", [False, True])
def test_every_comparable_request_is_replayed(monkeypatch, plant):
    run = _recorded(monkeypatch, plant)
    assert run.finished == 18  # 2 turns x 3 steps x 3 requests
    assert len(run.candidates) == 12  # the unseeded ones are not comparable
    assert {c.seed for c in run.candidates} == {None, 7, 8, 9}
    verdict = equivalence.detect(run)
    if not plant:
        assert verdict.verdict == "pass", verdict
        assert verdict.note == "12 of 18 finished requests equal their cache-off replays"
    else:
        assert verdict.failed and len(verdict.evidence) == 6, verdict  # the seeded ones


def test_candidates_round_trip_with_their_parameters():
    c = Candidate(
        turn=3,
        prompt=(1, 2),
        output=(5,),
        max_tokens=4,
        temperature=0.7,
        top_p=0.9,
        seed=11,
        stop_token_ids=(2,),
        ignore_eos=True,
    )
    assert Candidate.from_json(c.to_json()) == c
    # records written before parameters were kept read back as greedy
    assert Candidate.from_json([1, [1], [2], 8]) == Candidate(
        turn=1, prompt=(1,), output=(2,), max_tokens=8
    )
