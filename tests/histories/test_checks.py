"""Each history check on hand-made records: it fails on what it is there to see and
passes what is right (``histories/checks.py``)."""

from __future__ import annotations

from kvwatch.histories.checks import CONTENT, ENDED, INDEX, RAISED, REFERENCES, content, hits, judge
from kvwatch.histories.ops import History
from kvwatch.histories.play import Ended, Played, Sent

EMPTY = History("kvwatch", 0, ())


def _req(rid, expected, computed, output=(), *, session="", status="finished", hit=None, why=""):
    """A request as a client sent it and as it ended."""
    sent = Sent(rid=rid, turn=0, session=session, expected=tuple(expected), max_new=2)
    end = Ended(
        rid=rid,
        status=status,
        step=3,
        input=None if computed is None else tuple(computed),
        output=tuple(output),
        why=why,
        hit=hit,
    )
    return sent, end


def _played(*requests: tuple[Sent, Ended], error: str = "") -> Played:
    played = Played(history=EMPTY, error=error)
    for sent, end in requests:
        played.sent[sent.rid] = sent
        played.ended[end.rid] = end
    return played


A = _req("a", (1, 2, 3, 4), (1, 2, 3, 4), (9, 9), hit=0)


def test_content_fails_a_turn_computed_over_a_withdrawn_message_and_passes_the_right_one():
    ok = _req("t1", (1, 2, 5), (1, 2, 5), (7,), session="s")
    bad = _req("t2", (1, 2, 6), (1, 2, 8, 6), (7,), session="s")
    assert content(_played(A, ok)) == []
    (finding,) = content(_played(A, bad))
    assert finding.check == CONTENT and finding.rid == "t2" and "part at token 2" in finding.detail


def test_a_hit_longer_than_any_request_computed_is_a_content_finding():
    reuse = _req("b", (1, 2, 3, 7), (1, 2, 3, 7), hit=3)
    assert hits(_played(A, reuse)) == []  # a's first 3 tokens: computed before
    wrong = reuse[1]._replace(hit=4)  # its 4th token is its own: no request computed it
    (finding,) = hits(_played(A, (reuse[0], wrong)))
    assert finding.rid == "b" and "no request computed more than its first 3" in finding.detail


def test_an_unasked_end_and_a_raise_are_findings_and_a_missing_reference_is_a_skip():
    failed = _req("c", (5,), (5,), status="failed", why="no room")
    verdict = judge(_played(A, failed, error="RuntimeError: boom"), "failed", None)
    assert verdict.failed == {ENDED, RAISED}
    assert ("equivalence", "the target has no cache-off engine") in verdict.skipped
    assert judge(_played(A), "failed", None).findings == ()


def test_content_is_skipped_not_passed_where_the_loop_cannot_read_inputs():
    unread = _req("d", (5,), None, (3,))
    verdict = judge(_played(unread), "failed", lambda cs: ())
    skipped = [c for c, _ in verdict.skipped]
    assert skipped == [INDEX, REFERENCES, CONTENT, CONTENT]  # no cache log; inputs, and hits
    assert "cache hits" in verdict.skipped[-1][1]


def _take(sid: str, late: bool) -> None:
    """Raises from one function at one of two lines."""
    if late:
        raise AssertionError(f"session_id={sid!r} already has a slot")
    raise AssertionError(f"session_id={sid!r} already has a slot")


def _prefix() -> None:
    raise AssertionError("prefix shrank")


def _raised(fn, *args) -> Played:
    from kvwatch.histories.play import _where

    try:
        fn(*args)
    except AssertionError as exc:
        error, at = _where(exc)
    return Played(history=EMPTY, error=error, error_at=at)


def test_a_shrink_keeps_the_first_raise_its_place_not_its_line_number():
    from probes import make_probe

    from kvwatch.contracts import Finding, FindingKind
    from kvwatch.histories.checks import signature
    from kvwatch.histories.play import Played as P

    orphan = Finding(kind=FindingKind.ORPHAN, group="sglang.kv", pages=(1,), detail="1 units")
    leaking = P(history=EMPTY, reports=[("turn 0, mid-turn", make_probe(findings=(orphan,)))])
    (leak,) = judge(leaking, "failed", lambda cs: ()).findings
    take = _raised(_take, "s2", False)
    take.reports = leaking.reports
    verdict = judge(take, "failed", lambda cs: ())
    moved = judge(_raised(_take, "s0", True), "failed", lambda cs: ())
    other = judge(_raised(_prefix), "failed", lambda cs: ())
    assert verdict.primary == moved.primary  # the raise first, wherever its line
    assert ":" in take.error and take.error != moved.findings[0].detail
    assert not verdict.shows(other.primary)
    assert signature(leak) == "audit orphan sglang.kv"
    assert judge(leaking, "failed", lambda cs: ()).primary == signature(leak)


def test_an_engine_that_never_gets_idle_is_stuck_not_a_raise_of_kvwatch():
    from kvwatch.histories.checks import STUCK

    played = Played(history=EMPTY, stuck="the engine did not get idle in 5000 steps (r0001)")
    verdict = judge(played, "failed", lambda cs: ())
    assert verdict.failed == {STUCK} and verdict.primary == STUCK
