"""A session turn aborted before it ran leaves the session exactly as it was.

A turn that never ran computed nothing, so the session keeps neither its
user message nor its assistant tag: a client that times out and sends the
same message again gets it in the conversation once, not twice with an
empty assistant turn between. A turn cut after it ran keeps what it added
(its prompt and output so far, unrecorded): the slot computed them, and the
next turn goes on from there.
"""

from __future__ import annotations

import random
import time

import httpx
import pytest
from conversations import oracle, small_cache
from inprocserver import serving
from sessionsim import system_prompt, user_turn

from kvwatch.engine import Engine, EngineConfig, SamplingParams, SchedulerConfig
from kvwatch.engine.events import RequestAborted
from kvwatch.engine.model.tokenizer import END
from kvwatch.engine.request import Status
from kvwatch.server import EngineWorker, ServerSettings, create_app

PARAMS = SamplingParams(max_tokens=8)
FOREVER = SamplingParams(max_tokens=3000, ignore_eos=True)
ENDED = (Status.FINISHED, Status.ABORTED, Status.FAILED)
WAIT_S = 120  # a hang, not a slow machine


def engine() -> Engine:
    """One request runs at a time, so a second one queues behind it."""
    sched = SchedulerConfig(max_running=1, chunk_size=32)
    return Engine(EngineConfig(cache=small_cache(full=1024), scheduler=sched))


def finish(eng: Engine, rid: str):
    while eng.request_info(rid).status not in ENDED:
        eng.step()
    return eng.take(rid)


def session_state(eng: Engine, sid: str):
    """Everything a turn may change: tokens, recorded turns, the trajectory."""
    return eng.session_tokens(sid), eng.session_info(sid).turns, eng.trajectory(sid)


def opened(eng: Engine, rng: random.Random) -> tuple[str, list[int]]:
    """A recorded session with one finished turn; returns it and its next prompt."""
    sid = eng.open_session(record=True)
    first = system_prompt(rng, 60) + user_turn(rng, 20)
    assert finish(eng, eng.add_request(first, PARAMS, session_id=sid)).error is None
    return sid, [*eng.session_tokens(sid), *user_turn(rng, 24)]


@pytest.mark.parametrize("behind", [False, True])
def test_a_turn_aborted_while_queued_leaves_the_session_as_before(behind):
    """Aborted at once (``behind=False``), or after steps spent queued behind
    another request; the same prompt then runs as if the first try never was."""
    eng = engine()
    sid, prompt = opened(eng, random.Random(1))
    before = session_state(eng, sid)
    stages = []
    eng.events.subscribe(RequestAborted, lambda e: stages.append(e.stage))
    blocker = eng.add_request([7] * 40, FOREVER) if behind else None
    rid = eng.add_request(prompt, PARAMS, session_id=sid)
    for _ in range(3 if behind else 0):
        eng.step()
    assert eng.request_info(rid).status is Status.WAITING
    eng.abort(rid)
    assert finish(eng, rid).finish_reason == "abort" and stages == ["queued"]
    assert session_state(eng, sid) == before
    assert eng.session_info(sid).in_flight is None
    if blocker is not None:
        eng.abort(blocker)
        finish(eng, blocker)
    retried = finish(eng, eng.add_request(prompt, PARAMS, session_id=sid))
    assert retried.token_ids == oracle(prompt, PARAMS)
    assert retried.cached_tokens >= len(before[0]) - 16  # the slot was left as it was
    assert list(eng.session_tokens(sid)) == [*prompt, *retried.token_ids]
    assert eng.session_info(sid).turns == 2
    report = eng.probe()
    assert report.clean, report.findings


def test_the_first_turn_aborted_while_queued_leaves_an_empty_session():
    eng = engine()
    sid = eng.open_session(record=True)
    rid = eng.add_request([1, 2, 3, 4], PARAMS, session_id=sid)
    eng.abort(rid)
    finish(eng, rid)
    assert eng.session_tokens(sid) == () and eng.session_info(sid).turns == 0
    assert finish(eng, eng.add_request([5, 6], PARAMS, session_id=sid)).error is None
    assert eng.probe().clean


def test_a_turn_aborted_mid_run_keeps_its_prompt_and_output_unrecorded():
    """The behaviour kept: what the turn added stays, with no record and no turn
    end; the next turn extends it, and a rollback returns to the turn before."""
    eng, rng = engine(), random.Random(2)
    sid, prompt = opened(eng, rng)
    before_tokens, turns, trajectory = session_state(eng, sid)
    rid = eng.add_request(prompt, SamplingParams(max_tokens=40), session_id=sid)
    while eng.request_info(rid).output_tokens < 3:
        eng.step()
    eng.abort(rid)
    cut = finish(eng, rid)
    assert cut.finish_reason == "abort" and cut.token_ids
    assert list(eng.session_tokens(sid)) == [*prompt, *cut.token_ids]
    assert eng.session_info(sid).turns == turns and eng.trajectory(sid) == trajectory
    follow = [*eng.session_tokens(sid), END, *user_turn(rng, 8)]
    done = finish(eng, eng.add_request(follow, PARAMS, session_id=sid))
    assert done.token_ids == oracle(follow, PARAMS)
    eng.rollback_session(sid, 1)
    assert eng.session_tokens(sid) == before_tokens
    assert eng.probe().clean


# -- through the HTTP server ---------------------------------------------------------------
MODEL = ServerSettings().model_name


@pytest.fixture
def served():
    worker = EngineWorker(engine())
    with serving(create_app(worker, ServerSettings())) as url:
        yield url, worker


def wait_until(check, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def chat(sid: str, content: str, **extra) -> dict:
    return {"model": MODEL, "session_id": sid, "max_tokens": 6, "temperature": 0.0,
            "messages": [{"role": "user", "content": content}], **extra}  # fmt: skip


def leave_while_queued(url: str, worker: EngineWorker, body: dict) -> None:
    """Send a turn while a long request holds the engine's one running place,
    wait until the turn queues, and go away; then stop the long request."""
    eng, stages = worker.engine, []
    eng.events.subscribe(RequestAborted, lambda e: stages.append(e.stage))
    blocker = {"model": MODEL, "prompt": "count forever", "max_tokens": 3000,
               "ignore_eos": True, "stream": True}  # fmt: skip
    with httpx.stream("POST", f"{url}/v1/completions", json=blocker, timeout=WAIT_S) as hold:
        lines = hold.iter_lines()  # kept: dropping the iterator closes the connection
        assert next(line for line in lines if line.startswith("data: "))  # it runs
        turn = {**body, "stream": True}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=turn, timeout=WAIT_S) as r:
            assert r.status_code == 200
            queued = lambda: worker.call(eng.request_ids, Status.WAITING).result(WAIT_S)  # noqa: E731
            wait_until(queued, "the turn never queued")
        wait_until(lambda: stages == ["queued"], f"not aborted while queued: {stages}")
    wait_until(lambda: not worker.call(eng.request_ids).result(WAIT_S), "requests stay live")


def test_a_chat_turn_aborted_while_queued_is_sent_again_and_held_once(served):
    """A client times out on a turn still queued and sends the same message
    again: the session holds the message once, with no empty assistant turn."""
    url, worker = served
    eng = worker.engine
    sid = httpx.post(f"{url}/v1/sessions", json={}, timeout=WAIT_S).json()["id"]
    first = httpx.post(f"{url}/v1/chat/completions", json=chat(sid, "Plan it."), timeout=WAIT_S)
    assert first.status_code == 200, first.text
    history = worker.call(eng.session_tokens, sid).result(WAIT_S)
    message = "Now run the tests, please."
    leave_while_queued(url, worker, chat(sid, message))
    assert worker.call(eng.session_tokens, sid).result(WAIT_S) == history
    again = httpx.post(f"{url}/v1/chat/completions", json=chat(sid, message), timeout=WAIT_S)
    assert again.status_code == 200, again.text
    tokens = list(worker.call(eng.session_tokens, sid).result(WAIT_S))
    prompt = eng.chat_template.continue_session(history, [{"role": "user", "content": message}])
    assert tokens[: len(prompt)] == prompt
    encoded = eng.tokenizer.encode(message)
    hits = [i for i in range(len(tokens)) if tokens[i : i + len(encoded)] == encoded]
    assert len(hits) == 1, f"the message is in the session {len(hits)} times"
    info = httpx.get(f"{url}/v1/sessions/{sid}", timeout=WAIT_S).json()
    assert info["turns"] == 2 and info["tokens"] == len(tokens)
    report = worker.call(eng.probe).result(WAIT_S)
    assert report.clean, report.findings
