"""The ``index`` and ``references`` checks on hand-made logs: each rule fails on the
history that breaks it and passes the same history told right."""

from __future__ import annotations

from kvwatch.histories.cache_checks import INDEX, REFERENCES, index, references
from kvwatch.targets.driver.cache_watch import (
    Cleared,
    RefsMoved,
    Removed,
    RequestEnded,
    Seen,
    Split,
    Stored,
)

STORE = Stored(keys=(11, 12), blocks=(3, 4))
HELD = {11: 3, 12: 4}


def _rules(findings) -> list[str]:
    return [f.key for f in findings]


def test_an_index_told_right_passes():
    log = [
        STORE,
        Seen("step 1", HELD, {}),
        Removed(keys=(12,), blocks=(4,)),
        Seen("step 2", {11: 3}, {}),
        Stored(keys=(12,), blocks=(7,)),  # stored again after its removal: new tokens, a new block
        Seen("step 3", {11: 3, 12: 7}, {}),
        Cleared(),
        Seen("the end", {}, {}),
    ]
    assert index(log) == []


def test_a_key_stored_twice_without_its_removal_fails():
    found = index([STORE, Stored(keys=(12,), blocks=(9,))])
    assert _rules(found) == ["stored twice"] and found[0].check == INDEX


def test_a_block_under_a_second_key_fails():
    assert _rules(index([STORE, Stored(keys=(13,), blocks=(4,))])) == ["aliased block"]


def test_removing_a_key_the_events_never_put_on_that_block_fails():
    assert _rules(index([STORE, Removed(keys=(12,), blocks=(5,))])) == ["removed unheld"]
    assert _rules(index([Removed(keys=(99,), blocks=(1,))])) == ["removed unheld"]


def test_events_the_index_does_not_bear_out_fail_at_the_step_they_happen():
    untold_removal = [STORE, Seen("step 1", HELD, {}), Seen("step 2", {11: 3}, {})]
    (found,) = index(untold_removal)
    assert found.key == "disagrees" and "step 2" in found.detail
    untold_store = [Seen("step 1", {5: 1}, {})]
    assert "1 key(s) never told" in index(untold_store)[0].detail


def test_references_given_back_by_the_end_of_their_request_pass():
    log = [
        RefsMoved("1:r1", (0, 5), 1),
        Split(5, 6),  # node 5's refs copied onto its new upper half 6
        Seen("step 1", {}, {0: 1, 5: 1, 6: 1}),
        RefsMoved("1:r1", (0, 6, 5), -1),
        RequestEnded("r1"),
        Seen("the end", {}, {}),
    ]
    assert references(log, {}) == []


def test_a_reference_kept_past_its_request_fails_and_a_session_holder_waits_for_the_end():
    log = [RefsMoved("1:r1", (0, 5), 1), RequestEnded("r1"), Seen("step 1", {}, {0: 1, 5: 1})]
    found = references(log, {})
    assert _rules(found) == ["kept past its request", "never given back"]
    assert found[0].rid == "r1" and found[0].check == REFERENCES
    session = [RefsMoved("1:s0", (0,), 1), RequestEnded("t1"), RefsMoved("1:s0", (0,), -1)]
    assert references(session, {"t1": "s0"}) == []


def test_giving_back_what_was_never_taken_fails():
    assert _rules(references([RefsMoved("2:r2", (0,), -1)], {})) == ["given back twice"]


def test_node_refs_that_differ_from_the_log_fail():
    log = [RefsMoved("1:r1", (0,), 1), Seen("step 1", {}, {0: 2}), RefsMoved("1:r1", (0,), -1)]
    (found,) = references(log, {})
    assert found.key == "untold" and "step 1" in found.detail
