"""Each corpus row's shape (``hunts/history_rows.py``) on hand-made played histories: it
explains the history that has the row's shape and not one that differs in the one thing
the row is about."""

from __future__ import annotations

from hunts.history_rows import (
    FIXED,
    LIVE,
    ROWS,
    admission_stall,
    explained,
    mamba_queued_abort_commits_turn,
    mamba_session_first_turn_evict,
    pr_22862,
    pr_23496,
    retract_commits_session_turn,
    same_iteration_session_turns,
)
from kvwatch.histories.checks import AUDIT, CONTENT, RAISED, HistoryFinding, HistoryVerdict
from kvwatch.histories.ops import OPEN, TURN, History, Op
from kvwatch.histories.play import Ended, Played, Sent

T1, T2 = (5, 6, 7, 8), (9, 10, 11)


def _sent(rid: str, tokens: tuple[int, ...]) -> Sent:
    return Sent(rid=rid, turn=0, session="s0", expected=tokens, max_new=2)


def _ended(rid: str, status: str, input, output, **more) -> Ended:
    return Ended(rid=rid, status=status, step=5, input=input, output=output, **more)


def _session(
    *,
    first_status: str,
    first_admitted: bool,
    first_stages: list[str],
    aborted_in: str | None,
    second_input: tuple[int, ...],
) -> tuple[Played, HistoryVerdict]:
    """Session s0: turn t0 (T1) ended as given, then turn t1 (T2) computed over ``second_input``."""
    ops = (
        Op(turn=0, at=0, kind=OPEN, session="s0"),
        Op(turn=0, at=1, kind=TURN, rid="s0-t000", session="s0", tokens=T1, max_new=2),
        Op(turn=0, at=2, kind=TURN, rid="s0-t001", session="s0", tokens=T2, max_new=2,
           after="s0-t000"),
    )  # fmt: skip
    played = Played(history=History("sglang", 0, ops))
    played.sent["s0-t000"] = _sent("s0-t000", T1)
    played.sent["s0-t001"] = _sent("s0-t001", T2)  # t0 not committed: T2 alone
    played.ended["s0-t000"] = _ended("s0-t000", first_status, T1, (), admitted=first_admitted)
    played.ended["s0-t001"] = _ended("s0-t001", "finished", second_input, (1,))
    played.stages["s0-t000"] = first_stages
    if aborted_in is not None:
        played.aborted_in["s0-t000"] = aborted_in
    wrong = second_input != T2
    findings = (HistoryFinding(check=CONTENT, detail="differs", rid="s0-t001"),) if wrong else ()
    return played, HistoryVerdict(findings, ())


def test_a_turn_over_a_retracted_and_aborted_turn_is_the_retraction_row():
    played, verdict = _session(
        first_status="aborted-in-queue",
        first_admitted=True,
        first_stages=["decoding", "retracted"],
        aborted_in="retracted",
        second_input=T1 + T2,
    )
    assert "retracted" in retract_commits_session_turn(played, verdict)
    assert mamba_queued_abort_commits_turn(played, verdict) is None  # it ran
    right, clean = _session(
        first_status="aborted-in-queue",
        first_admitted=True,
        first_stages=["decoding", "retracted"],
        aborted_in="retracted",
        second_input=T2,
    )
    assert retract_commits_session_turn(right, clean) is None


def test_a_turn_over_a_turn_aborted_in_the_queue_is_the_mamba_queue_row():
    played, verdict = _session(
        first_status="aborted-in-queue",
        first_admitted=False,
        first_stages=["queued"],
        aborted_in="queued",
        second_input=T1 + T2,
    )
    assert "never run" in mamba_queued_abort_commits_turn(played, verdict)
    assert retract_commits_session_turn(played, verdict) is None  # never retracted
    finished, verdict = _session(
        first_status="finished",
        first_admitted=True,
        first_stages=["decoding"],
        aborted_in=None,
        second_input=T1 + T2,
    )
    assert mamba_queued_abort_commits_turn(finished, verdict) is None


def test_a_next_turn_taken_beside_a_retracted_one_is_the_retraction_row_when_it_fails():
    played = Played(history=History("sglang", 0, ()))
    played.sent["s0-t001"] = _sent("s0-t001", T2)._replace(beside="retracted")
    failing = HistoryVerdict(
        (HistoryFinding(check=AUDIT, detail="x", key="double_owned sglang.kv"),), ()
    )
    assert "retracted" in retract_commits_session_turn(played, failing)
    assert retract_commits_session_turn(played, HistoryVerdict((), ())) is None


def _audit(key: str, detail: str) -> HistoryVerdict:
    return HistoryVerdict((HistoryFinding(check=AUDIT, detail=detail, key=key),), ())


def test_an_evicted_first_turn_with_an_orphan_mamba_slot_is_the_eviction_row():
    played = Played(history=History("sglang", 0, ()))
    played.sent["s0-t000"] = _sent("s0-t000", T1)
    why = "The request is aborted by a higher priority request."
    played.ended["s0-t000"] = _ended("s0-t000", "rejected", T1, (), why=why, admitted=False)
    orphan = _audit("orphan sglang.mamba", "1 units ... held by no request")
    assert "higher priority" in mamba_session_first_turn_evict(played, orphan)
    assert mamba_session_first_turn_evict(played, _audit("orphan sglang.kv", "...")) is None
    played.ended["s0-t000"] = played.ended["s0-t000"]._replace(why="Aborted")
    assert mamba_session_first_turn_evict(played, orphan) is None


def test_the_take_crash_and_the_fixed_rows_read_their_findings():
    crash = HistoryVerdict(
        (HistoryFinding(check=RAISED, detail="already has a slot", key="AssertionError x/streaming_session.py in take"),),
        (),
    )  # fmt: skip
    assert same_iteration_session_turns(Played(history=History("sglang", 0, ())), crash)
    played = Played(history=History("sglang", 0, ()))
    played.sent["s0-t000"] = _sent("s0-t000", T1)
    played.stages["s0-t000"] = ["decoding", "retracted", "decoding"]
    tail = _audit("orphan sglang.kv", "1 units (1 last held by session s0 SessionSlot row 3)")
    assert pr_22862(played, tail) and not pr_22862(Played(history=played.history), tail)
    slot = _audit("orphan sglang.mamba", "(1 last held by session s0 SessionSlot mamba slot 4)")
    assert pr_23496(played, slot)
    assert not pr_23496(played, _audit("orphan sglang.mamba", "last held by request s0-t000"))
    stall = _audit("starved sglang.kv", "the running batch is empty (batch_is_full=True)")
    assert admission_stall(played, stall) and not admission_stall(played, tail)


def test_every_row_is_in_the_corpus_and_explained_lists_each_row_shown():
    import json
    from pathlib import Path

    corpus = json.loads((Path(__file__).parents[2] / "docs" / "real-bugs.json").read_text())
    ids = {r["id"] for r in (corpus["rows"] if isinstance(corpus, dict) else corpus)}
    assert {row.id for row in ROWS} <= ids
    assert len(LIVE) + len(FIXED) == len(ROWS)
    played, verdict = _session(
        first_status="aborted-in-queue",
        first_admitted=False,
        first_stages=["queued"],
        aborted_in="queued",
        second_input=T1 + T2,
    )
    assert [row for row, _ in explained(played, verdict)] == [
        "sglang-mamba-queued-abort-commits-turn"
    ]
