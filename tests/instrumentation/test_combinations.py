"""Combination and boundary coverage: the counter counts each edge exactly when it
happens (synthetic event sequences), the engine says what it needs to (path
keys, branch points to the token, refused session calls), a gap planted in
the load shows as never taken, and the console line stays short."""

from __future__ import annotations

import pytest
from turncuts import cut_turns

from kvwatch.engine import Engine, SamplingParams
from kvwatch.engine.config import CacheConfig
from kvwatch.engine.errors import SessionError
from kvwatch.engine.events import (
    EventBus,
    NodeEvicted,
    RequestAborted,
    RequestAdded,
    RequestFinished,
    RequestPaused,
    RequestRecovered,
    RequestRetracted,
    RequestScheduled,
    RequestWaiting,
    SessionBusy,
    SessionClosed,
    SessionOpened,
    SessionRolledBack,
    TokensGenerated,
)
from kvwatch.engine.paths import NO_PATH, path_key
from kvwatch.gate.outputs.summary import NEVER_SHOWN, coverage_line
from kvwatch.instrumentation import combos
from kvwatch.instrumentation.combo_counter import CombinationCounter
from kvwatch.instrumentation.coverage import MACHINES, coverage
from kvwatch.server import ServerSettings

MODEL = ServerSettings().model_name


class Feed:
    """A bus, a counter on it, and shorthand for the events a test sends."""

    def __init__(self) -> None:
        self.bus = EventBus()
        self.counter = CombinationCounter(self.bus, page=16, window=32)

    def add(self, rid, *, path=7, n=100, prompt=None, session=None) -> None:
        self.bus.emit(
            RequestAdded(
                request_id=rid,
                prompt_tokens=n,
                step=0,
                session_id=session,
                path_key=path,
                prompt_key=prompt if prompt is not None else hash(rid),
            )
        )

    def schedule(self, rid, branch=0) -> None:
        self.bus.emit(
            RequestScheduled(
                request_id=rid, step=0, hit_tokens=0, cached_tokens=0, branch_tokens=branch
            )
        )

    def emit(self, *events) -> None:
        for e in events:
            self.bus.emit(e)

    def taken(self, machine: str) -> dict[str, int]:
        return self.counter.taken()[machine]

    def empty(self) -> bool:
        c = self.counter
        return c.live == {} and c.paths == {} and c.sessions == {}


def test_the_boundary_geometry_is_the_engines_default():
    assert (CacheConfig().page_size, CacheConfig().window) == (combos.PAGE, combos.WINDOW)
    names = [m[0] for m in combos.MACHINES]
    assert names == list(MACHINES)[4:]  # registered after the lifecycles, in order


# -- turn abort ---------------------------------------------------------------------------
@pytest.mark.parametrize("stage", combos.TURN_STAGES)
def test_a_session_turn_aborted_at_each_stage_counts_that_stage_once(stage):
    f = Feed()
    f.emit(SessionOpened("s"))
    f.add("r", session="s")
    walk = {
        "prefilling": [],
        "decoding": [TokensGenerated(request_id="r", count=1, first=True, step=1)],
        "verifying": [
            TokensGenerated(request_id="r", count=1, first=True, step=1)
        ],  # the abort says "verify"
        "retracted": [RequestRetracted("r", 48, "prefill")],
        "paused": [
            TokensGenerated(request_id="r", count=1, first=True, step=1),
            RequestPaused("r"),
        ],
        "recovering": [RequestRetracted("r", 48, "prefill"), RequestRecovered("r", 48)],
    }
    if stage != "queued":
        f.schedule("r")
        f.emit(*walk[stage])
    f.emit(RequestAborted("r", "verify" if stage == "verifying" else "x"))
    assert f.taken(combos.TURN_ABORT) == {f"{stage} -> aborted": 1}


def test_an_abort_outside_a_session_and_a_finished_turn_count_no_turn_abort():
    f = Feed()
    f.emit(SessionOpened("s"))
    f.add("plain")
    f.add("turn", session="s")
    f.emit(
        RequestAborted("plain", "queued"),
        RequestFinished(
            request_id="turn", reason="stop", prompt_tokens=100, output_tokens=1, cached_tokens=0
        ),
    )
    assert f.taken(combos.TURN_ABORT) == {}
    f.emit(SessionClosed("s", "closed"))
    assert f.empty()


# -- same path ----------------------------------------------------------------------------
def test_crossings_on_one_path_count_one_edge_per_kind_of_other_stage():
    twice = {("retracted", "prefilling"), ("retracted", "queued")}  # the mover, then "second"
    f = Feed()
    for rid in ("mover", "prefilling", "queued", "waiting", "decoding"):
        f.add(rid, path=7)
    f.add("elsewhere", path=8)  # another path: never counted
    f.schedule("prefilling")
    f.schedule("decoding")
    f.emit(
        TokensGenerated(request_id="decoding", count=1, first=True, step=1),
        RequestWaiting("waiting", 0),
    )
    f.schedule("mover")
    f.emit(RequestRetracted("mover", 48, "prefill"))
    assert f.taken(combos.SAME_PATH) == {
        combos.same_path("retracted", "prefilling"): 1,
        combos.same_path("retracted", "queued"): 1,  # queued and waiting: one edge
    }
    f.add("second", path=7)
    f.schedule("second")
    f.emit(RequestRetracted("second", 48, "prefill"))  # the mover is retracted now
    f.emit(RequestRecovered("mover", 48))  # "second" is
    f.emit(NodeEvicted(node_id=3, depth=32, page_ids=(1, 2), path_key=7))
    f.emit(NodeEvicted(node_id=4, depth=32, page_ids=(3,), path_key=9))  # nobody on it
    # each mover: once per kind of stage the others are in; nothing for "elsewhere",
    # for the decoding one, or for path 9
    assert f.taken(combos.SAME_PATH) == {
        combos.same_path(mover, other): 2 if (mover, other) in twice else 1
        for mover in combos.MOVERS
        for other in combos.OTHERS
    }


def test_a_request_alone_on_its_path_crosses_nothing():
    f = Feed()
    f.add("alone", path=7)
    f.schedule("alone")
    f.emit(RequestRetracted("alone", 48, "prefill"), RequestRecovered("alone", 48))
    f.add("short", path=NO_PATH)  # no full page: on no path
    f.emit(NodeEvicted(node_id=1, depth=16, page_ids=(1,), path_key=NO_PATH))
    assert f.taken(combos.SAME_PATH) == {}


# -- session op ---------------------------------------------------------------------------
def test_refused_calls_count_the_turns_stage_and_a_retried_close_its_refusal():
    f = Feed()
    f.emit(SessionOpened("s"))
    f.add("t", session="s")
    f.emit(SessionBusy("s", "close", "t"), SessionBusy("s", "rollback", "t"))  # queued
    f.schedule("t")
    f.emit(SessionBusy("s", "idle timeout", "t"))  # prefilling: running
    f.emit(RequestRetracted("t", 48, "prefill"), SessionBusy("s", "close", "t"))  # stepped back
    f.emit(
        RequestFinished(
            request_id="t", reason="stop", prompt_tokens=100, output_tokens=1, cached_tokens=0
        )
    )
    f.emit(SessionRolledBack("s", 1), SessionClosed("s", "closed"))
    op = combos.session_op
    assert f.taken(combos.SESSION_OP) == {
        op("close", "queued", "refused"): 2,
        op("rollback", "queued", "refused"): 1,
        op("idle timeout", "running", "refused"): 1,
        op("rollback", "no turn", "rolled back"): 1,
        op("close", "no turn", "closed"): 1,
        op("close", "refused", "closed"): 1,
    }
    assert f.empty()


def test_calls_after_a_cut_turn_count_from_cut_until_the_next_turn_or_rollback():
    f = Feed()
    op = combos.session_op
    for sid in ("a", "b", "c"):
        f.emit(SessionOpened(sid))
        f.add(f"{sid}-turn", session=sid)
        f.emit(RequestAborted(f"{sid}-turn", "queued"))
    f.emit(SessionRolledBack("a", 1), SessionClosed("a", "closed"))  # cut, then no turn
    f.emit(SessionClosed("b", "idle timeout"))
    f.add("c-next", session="c")  # a new turn: no longer cut
    f.emit(
        RequestFinished(
            request_id="c-next", reason="stop", prompt_tokens=100, output_tokens=1, cached_tokens=0
        ),
        SessionClosed("c", "closed"),
    )
    assert f.taken(combos.SESSION_OP) == {
        op("rollback", "cut", "rolled back"): 1,
        op("close", "no turn", "closed"): 2,
        op("idle timeout", "cut", "timed out"): 1,
    }
    assert f.empty()


def test_a_session_whose_close_was_refused_then_timed_out():
    f = Feed()
    f.emit(SessionOpened("s"))
    f.add("t", session="s")
    f.schedule("t")
    f.emit(
        SessionBusy("s", "close", "t"),
        RequestFinished(
            request_id="t", reason="stop", prompt_tokens=100, output_tokens=1, cached_tokens=0
        ),
    )
    f.emit(SessionClosed("s", "idle timeout"))
    op = combos.session_op
    assert f.taken(combos.SESSION_OP) == {
        op("close", "running", "refused"): 1,
        op("idle timeout", "no turn", "timed out"): 1,
        op("idle timeout", "refused", "timed out"): 1,
    }


# -- boundaries ---------------------------------------------------------------------------
def test_branch_offsets_count_only_prompts_that_part_from_the_cache_inside_them():
    f = Feed()
    for rid, n, b in (("miss", 100, 0), ("whole", 100, 100), ("p15", 100, 47), ("p0", 100, 64)):
        f.add(rid, n=n, path=hash(rid))
        f.schedule(rid, b)
    assert f.taken(combos.PAGE_OFFSET) == {combos.offset(15, 16): 1, combos.offset(0, 16): 1}
    assert f.taken(combos.WINDOW_OFFSET) == {combos.offset(15, 32): 1, combos.offset(0, 32): 1}


def test_prompt_ends_around_page_and_window_edges():
    f = Feed()
    for n in (95, 96, 97, 98, 111, 112, 113):
        f.add(f"r{n}", n=n, path=n)
        f.schedule(f"r{n}")
    assert f.taken(combos.PROMPT_END) == {
        combos.prompt_end(15, 16): 2,  # 95, 111
        combos.prompt_end(0, 16): 2,  # 96, 112
        combos.prompt_end(1, 16): 2,  # 97, 113
        combos.prompt_end(31, 32): 1,
        combos.prompt_end(0, 32): 1,
        combos.prompt_end(1, 32): 1,
    }


def test_siblings_are_as_long_on_one_path_and_differ():
    f = Feed()
    f.add("a", path=7, n=96, prompt=1)
    f.add("same prompt", path=7, n=96, prompt=1)
    f.add("longer", path=7, n=97, prompt=2)
    f.add("elsewhere", path=8, n=96, prompt=3)
    for rid in ("a", "same prompt", "longer", "elsewhere"):
        f.schedule(rid)
    assert f.taken(combos.SIBLINGS) == {}
    f.add("sibling", path=7, n=96, prompt=4)
    f.schedule("sibling")
    assert f.taken(combos.SIBLINGS) == {combos.EQUAL_LENGTH: 1}


# -- the engine says what the counter needs -------------------------------------------------
def test_branch_points_to_the_token_and_path_keys_from_a_real_engine():
    engine = Engine()
    seen: list = []
    for kind in (RequestAdded, RequestScheduled, NodeEvicted):
        engine.events.subscribe(kind, seen.append)
    trunk = list(range(40, 152))
    engine.generate([trunk], SamplingParams(max_tokens=2))
    branches = {b: trunk[:b] + [200 + i % 40 for i in range(96 - b)] for b in (33, 47, 48, 63, 64)}
    for prompt in branches.values():
        engine.generate([prompt], SamplingParams(max_tokens=2))
    engine.generate([trunk[:80]], SamplingParams(max_tokens=2))  # wholly cached
    got = [e.branch_tokens for e in seen if isinstance(e, RequestScheduled)]
    assert got == [0, *branches, 80]
    keys = {e.path_key for e in seen if isinstance(e, RequestAdded)}
    assert keys == {path_key(trunk, None, 16)} and NO_PATH not in keys
    engine.flush_cache()
    assert {e.path_key for e in seen if isinstance(e, NodeEvicted)} == keys


def test_a_refused_close_or_rollback_is_an_event_naming_the_turn():
    engine = Engine()
    busy: list[SessionBusy] = []
    engine.events.subscribe(SessionBusy, busy.append)
    sid = engine.open_session()
    rid = engine.add_request("a turn", SamplingParams(max_tokens=2), session_id=sid)
    for call in (engine.close_session, engine.rollback_session):
        with pytest.raises(SessionError, match="in flight"):
            call(sid)
    with pytest.raises(SessionError):
        engine.close_session(sid, reason="idle timeout")
    assert busy == [
        SessionBusy(sid, "close", rid),
        SessionBusy(sid, "rollback", rid),
        SessionBusy(sid, "idle timeout", rid),
    ]


# -- a planted gap ------------------------------------------------------------------------
def test_a_turn_cut_at_every_stage_takes_every_turn_abort_edge_and_a_planted_gap_shows():
    full, reasons, abandoned = cut_turns(combos.TURN_STAGES)
    assert full["never"] == [] and full["unlisted"] == {}
    assert set(reasons.values()) == {"abort"} and abandoned == [], (reasons, abandoned)
    planted, _, _ = cut_turns([s for s in combos.TURN_STAGES if s != "verifying"])
    assert planted["never"] == ["verifying -> aborted"]


# -- the console line ---------------------------------------------------------------------
class _Summary:
    def __init__(self, total: dict) -> None:
        self.coverage = {"total": total, "profiles": {}}


def test_the_coverage_line_is_a_count_and_the_first_few_never_taken():
    nothing = coverage({})
    line = coverage_line(_Summary(nothing))
    listed = sum(len(m.transitions) for m in MACHINES.values())
    assert line.startswith(f"coverage: 0 of {listed} transitions taken in {len(MACHINES)} machines")
    assert f"and {listed - NEVER_SHOWN} more (summary.json)" in line and len(line) < 300
    everything = coverage({name: dict.fromkeys(m.transitions, 1) for name, m in MACHINES.items()})
    assert coverage_line(_Summary(everything)).endswith("; every transition taken")
    # the edges a machine lists apart (taken when seen, never owed) are counted apart
    apart = {name: dict.fromkeys((*m.transitions, *m.also), 1) for name, m in MACHINES.items()}
    extra = sum(len(m.also) for m in MACHINES.values())
    line = coverage_line(_Summary(coverage(apart)))
    assert line.startswith(f"coverage: {listed} of {listed} transitions taken")
    assert f"(and {extra} listed apart); every transition taken" in line
    odd = coverage({"request": {"queued -> nowhere": 1}})
    assert coverage_line(_Summary(odd)).endswith("; 1 seen outside the machines")


LIVE = (
    "queued",
    "waiting",
    "prefilling",
    "decoding",
    "verifying",
    "retracted",
    "paused",
    "recovering",
)


@pytest.mark.parametrize("stage", LIVE)
def test_a_rare_transition_is_listed_and_counted_but_never_owed(stage):
    """``STAGE -> failed`` (a request that finds no pages even alone at any live
    stage: a failpoint while nothing else can be let go) is a correct transition no load can be
    sure to take: seen, it is taken, not unlisted; unseen, not among the never
    taken."""
    edge = f"{stage} -> failed"
    seen = coverage({"request": {"new -> queued": 1, edge: 2}})["request"]
    assert seen["taken"][edge] == 2 and seen["unlisted"] == {}
    unseen = coverage({"request": {"new -> queued": 1}})["request"]
    assert edge not in unseen["never"]
    assert coverage({"request": {"new -> failed": 1}})["request"]["unlisted"] == {
        "new -> failed": 1
    }
