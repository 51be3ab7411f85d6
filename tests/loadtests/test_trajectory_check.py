"""The rl-rollout client's trajectory check against a real server in process: a
recorded session with a rollback agrees with what its turns answered; a loss
mask a token early (planted in the record merge) or a turn the client thinks
it kept and the server dropped is named."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from kvwatch.engine import Engine, EngineConfig, records
from kvwatch.loadtests.trajectory import trajectory_problem
from kvwatch.server import EngineWorker, ServerSettings, create_app


def _session(turns: int = 4, rollback_after: int = 1) -> tuple[dict, list]:
    """A recorded session's trajectory, and each kept turn's (prompt_tokens, output ids)."""
    worker = EngineWorker(Engine(EngineConfig()))
    kept = []
    with TestClient(create_app(worker, ServerSettings())) as client:
        sid = client.post("/v1/sessions", json={"record": True}).json()["id"]
        for i in range(turns):
            body = {"model": "t", "messages": [{"role": "user", "content": f"turn {i} words"}]}
            body |= {"max_tokens": 6, "return_token_ids": True, "session_id": sid}
            data = client.post("/v1/chat/completions", json=body).json()
            kept.append((data["usage"]["prompt_tokens"], data["choices"][0]["token_ids"]))
            if i == rollback_after:
                assert client.post(f"/v1/sessions/{sid}/rollback", json={"steps": 1}).is_success
                kept.pop()
        return client.get(f"/v1/sessions/{sid}/trajectory").json(), kept


def test_a_recorded_session_agrees_with_what_its_turns_answered():
    trajectory, kept = _session()
    assert len(kept) == 3 and trajectory_problem(trajectory, kept) is None
    # a turn the server dropped, or one it kept that the client rolled back
    extra = (len(trajectory["token_ids"]), [1] * 6)
    assert "the 4 kept turns generated 24" in trajectory_problem(trajectory, [*kept, extra])
    assert "the 2 kept turns generated 12" in trajectory_problem(trajectory, kept[:-1])


def test_a_loss_mask_a_token_early_is_named(monkeypatch):
    merge = records.SessionRecords.merge

    def early(self, session_tokens):  # the planted bug: every output starts a token early
        out = merge(self, session_tokens)
        mask = [*out.loss_mask[1:], 0]
        return out._replace(loss_mask=mask)

    monkeypatch.setattr(records.SessionRecords, "merge", early)
    trajectory, kept = _session()
    problem = trajectory_problem(trajectory, kept)
    assert problem is not None and "is marked at" in problem, problem


@pytest.mark.parametrize("mask", [[1, 1], [0, 0, 0]])
def test_a_mask_of_another_length_than_the_tokens_is_named(mask):
    assert "loss mask of" in trajectory_problem({"token_ids": [5, 6, 7, 8], "loss_mask": mask}, [])
