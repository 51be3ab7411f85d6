"""Replays chosen by what the requests exercised.

A budget of replays (``--max-replays``, 16 in the quick tier) goes first to
the requests that resumed at a boundary, were retracted, recovered or paused
(their ``marks``, which the server's finished log records from the engine's
events), a mark at a time, the rarest first; the rest of the budget is spread
over the others. The marks themselves come from a real server here.
"""

from __future__ import annotations

from fastapi.testclient import TestClient

from kvwatch.engine import Engine
from kvwatch.harness.run_record import Candidate
from kvwatch.server import EngineWorker, ServerSettings, create_app
from kvwatch.targets.kvwatch.replay import choose, spread_order

MODEL = ServerSettings().model_name


def candidates(marked: dict[int, tuple[str, ...]], n: int = 40) -> list[Candidate]:
    return [
        Candidate(turn=0, prompt=(i,), output=(i,), max_tokens=1, marks=marked.get(i, ()))
        for i in range(n)
    ]


def chosen(cs: list[Candidate], most: int | None) -> list[int]:
    return [c.prompt[0] for c in choose(cs, most)]


def test_a_budget_goes_to_every_mark_the_rarest_first_then_to_the_rest_spread():
    marked = {3: ("shallow",), 30: ("shallow", "page-edge")}
    marked |= {i: ("page-edge",) for i in range(0, 40, 5) if i != 30}
    cs = candidates(marked)
    two = chosen(cs, 2)  # a request of each mark, the rarer one's first
    assert len(two) == 2 and {3, 30} & set(two) and all(i in marked for i in two)
    four = chosen(cs, 4)  # a mark at a time: both shallow requests by now
    assert {3, 30} <= set(four) and all(i in marked for i in four)
    assert set(marked) <= set(chosen(cs, 12))  # every marked one, then the rest
    twelve = chosen(cs, 12)
    assert len(twelve) == 12 and len([i for i in twelve if i not in marked]) == 3
    assert twelve == sorted(twelve)  # in the run's order
    assert chosen(cs, None) == list(range(40)) == chosen(cs, 40)


def test_without_marks_it_is_the_even_spread_it_was():
    cs = candidates({})
    assert chosen(cs, 5) == [0, 10, 20, 29, 39]
    assert spread_order(list(range(10))) == [9, 0, 3, 6, 1, 4, 5, 8, 2, 7]


def test_the_server_marks_what_a_request_exercised():
    """Same prompt twice: the second resumes from the first's snapshot (16 tokens
    deep, shallower than the 32-token window, at a page edge); a third request is
    retracted by the test controls and recovers."""
    with TestClient(create_app(EngineWorker(Engine()), ServerSettings(enable_probe=True))) as c:
        c.get("/debug/finished")  # empty the log
        body = {"model": MODEL, "max_tokens": 2, "temperature": 0}
        prompt = [{"role": "user", "content": "x" * 40}]
        for _ in range(2):
            assert c.post("/v1/chat/completions", json={**body, "messages": prompt}).is_success
        retract = {"retract_after": 8, "hold_steps": 2}
        other = [{"role": "user", "content": "a request that is retracted " * 3}]
        extra = {"messages": other, "kvwatch": retract, "max_tokens": 4}
        assert c.post("/v1/chat/completions", json={**body, **extra}).is_success
        finished = c.get("/debug/finished").json()["requests"]
    marks = [tuple(r["marks"]) for r in finished]
    assert (marks[0] == () and "shallow" in marks[1]) or "page-edge" in marks[1], marks
    assert {"retracted", "recovered"} <= set(marks[2]), marks
    parsed = Candidate.from_finished(0, finished[2])
    assert (
        Candidate.from_json(parsed.to_json()).marks == parsed.marks == tuple(finished[2]["marks"])
    )


def test_a_small_budget_replays_the_shallow_resume_that_shows_a_bad_restore(monkeypatch):
    """The window restore planted to read the padding (a resume shallower than the
    window): twenty-odd ordinary requests, two that resume shallow. Four replays chosen
    by what the requests exercised catch it; four spread evenly over the run do not."""
    from kvwatch.engine.cache import sliding_window
    from kvwatch.targets.kvwatch.replay import Reference, spread

    honest = sliding_window.SlidingWindowPages.restore

    def padded(self, holder, snapshot, d):
        read = self.pools[sliding_window.SWA_WINDOW].read_tokens
        monkeypatch.setattr(
            self.pools[sliding_window.SWA_WINDOW],
            "read_tokens",
            lambda pages, off, n: read(pages, 0, n),
        )
        try:
            honest(self, holder, snapshot, d)
        finally:
            monkeypatch.setattr(self.pools[sliding_window.SWA_WINDOW], "read_tokens", read)

    monkeypatch.setattr(sliding_window.SlidingWindowPages, "restore", padded)
    engine = Engine()
    body = {"model": MODEL, "max_tokens": 16, "temperature": 0}
    shared = "twenty chars shared"  # a first page (16 tokens) and a few more
    with TestClient(create_app(EngineWorker(engine), ServerSettings(enable_probe=True))) as c:
        c.get("/debug/finished")
        for i in range(24):  # raw prompts: no chat template shared by all
            prompt = f"{i:02d} an ordinary request with a first page of its own"
            if i in (4, 11, 19):  # the later two resume from the first one's 16-token snapshot
                prompt = f"{shared}{i}: then it goes a long way of its own to the end"
            assert c.post("/v1/completions", json={**body, "prompt": prompt}).is_success
        finished = c.get("/debug/finished").json()["requests"]
    candidates = [Candidate.from_finished(0, r) for r in finished]
    assert any("shallow" in c.marks for c in candidates)
    reference = Reference(engine.config)

    def wrong(chosen):
        return [r for r in reference.replay(chosen) if r.cached != r.reference]

    assert wrong(choose(candidates, 4))  # the shallow resume is among the four
    assert not wrong(spread(candidates, 4))  # evenly spread, it is not
