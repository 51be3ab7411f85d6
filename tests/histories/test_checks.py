"""Each history check on hand-made records: it fails on what it is there to see and
passes what is right (``histories/checks.py``)."""

from __future__ import annotations

from kvwatch.histories.checks import CONTENT, ENDED, RAISED, content, hits, judge
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
    assert [c for c, _ in verdict.skipped] == [CONTENT, CONTENT]  # inputs, and hits
    assert "cache hits" in verdict.skipped[1][1]


def test_a_shrink_keeps_the_first_raise_its_place_not_its_line_number():
    from kvwatch.histories.checks import AUDIT, HistoryFinding, HistoryVerdict, signature

    take = "AssertionError: session_id='s2' already has a slot (at /x/streaming_session.py:215 in take)"
    moved = take.replace(":215", ":207").replace("s2", "s0")
    other = "AssertionError: prefix shrank (at /x/streaming_session.py:132 in try_match_prefix)"
    leak = HistoryFinding(AUDIT, "turn 0, mid-turn: orphan sglang.kv: sglang.kv: 1 units ...")
    verdict = HistoryVerdict((leak, HistoryFinding(RAISED, take)), ())
    assert verdict.primary == signature(HistoryFinding(RAISED, moved))  # the raise first
    assert not verdict.shows(signature(HistoryFinding(RAISED, other)))
    assert signature(leak) == "audit orphan sglang.kv"
    assert HistoryVerdict((leak,), ()).primary == signature(leak)


def test_an_engine_that_never_gets_idle_is_stuck_not_a_raise_of_kvwatch():
    from kvwatch.histories.checks import STUCK

    played = Played(history=EMPTY, stuck="the engine did not get idle in 5000 steps (r0001)")
    verdict = judge(played, "failed", lambda cs: ())
    assert verdict.failed == {STUCK} and verdict.primary == STUCK
