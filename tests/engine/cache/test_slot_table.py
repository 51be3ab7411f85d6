"""SlotTable on its own: round-robin tickets, lookup, validation and confirm's invariant."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvwatch.engine.cache.slots import CONTENT_MISMATCH, LONGER_THAN_PROMPT, SlotTable
from kvwatch.engine.faults import Fault

NO_PAGES: dict[str, np.ndarray] = {}
STALE = frozenset({Fault.STALE_SLOT_ENTRY})


def confirm(table: SlotTable, tokens: list[int], boundary: int) -> None:
    table.confirm(table.prepare(tokens, boundary, None), NO_PAGES)


def test_prepare_hands_out_slots_round_robin_and_an_abort_burns_a_step():
    table = SlotTable(3, "cfg", frozenset())
    tickets = [table.prepare([1, 2, 3], 2, None) for _ in range(4)]  # none confirmed
    assert [t.slot for t in tickets] == [0, 1, 2, 0]
    assert table.next_slot == 1 and not table.entries


def test_lookup_picks_the_longest_matching_prefix_within_the_limit():
    table = SlotTable(4, "cfg", frozenset())
    tokens = list(range(100))
    confirm(table, tokens, 10)
    confirm(table, tokens, 40)
    confirm(table, [7] * 100, 60)
    assert table.lookup(tokens, 99, None).length == 40
    assert table.lookup(tokens, 39, None).length == 10
    assert table.lookup(tokens[:5], 4, None) is None
    assert table.lookup(tokens, 99, "another-adapter") is None  # the extra key is in the hash


def test_keys_depend_on_the_config_fingerprint():
    tokens = list(range(20))
    assert SlotTable(1, "a", frozenset()).key(tokens, 10, None) != SlotTable(
        1, "b", frozenset()
    ).key(tokens, 10, None)


def test_confirm_erases_every_other_entry_of_the_reused_slot():
    table = SlotTable(2, "cfg", frozenset())
    a, b = list(range(50)), list(range(100, 200))
    confirm(table, a, 30)  # slot 0
    table.prepare([1], 1, None)  # slot 1: aborted, the step is burned
    _, erased = table.confirm(table.prepare(b, 80, None), NO_PAGES)  # wraps onto slot 0
    assert erased == 1
    assert table.lookup(a + [1] * 60, 109, None) is None
    assert not table.findings()


def test_stale_entry_is_reported_and_check_rejects_it_unless_the_fault_is_on():
    table = SlotTable(2, "cfg", STALE)
    a, b = list(range(50)), list(range(100, 200))
    confirm(table, a, 30)
    table.prepare([1], 1, None)
    confirm(table, b, 80)  # slot 0 now holds b[:80]; a's entry still points at it
    details = [f.detail for f in table.findings()]
    assert len(details) == 2 and "2 entries" in details[0] and "30-token prefix" in details[1]

    short, long = a + [5] * 20, a + [5] * 100
    entry = table.lookup(short, len(short) - 1, None)
    assert entry.slot == 0 and entry.length == 30
    assert table.check(entry, short, len(short) - 1, None) == LONGER_THAN_PROMPT
    entry = table.lookup(long, len(long) - 1, None)
    assert table.check(entry, long, len(long) - 1, None) is None  # the bug: restore blind
    table.faults = frozenset()
    assert table.check(entry, long, len(long) - 1, None) == CONTENT_MISMATCH


def test_clear_drops_the_slot_and_its_entries():
    table = SlotTable(1, "cfg", frozenset())
    confirm(table, list(range(40)), 32)
    table.clear(0)
    assert table.slots[0].empty and not table.entries and not table.findings()


ops = st.lists(
    st.tuples(
        st.sampled_from(["confirm", "abort", "clear"]),
        st.integers(0, 3),  # which conversation
        st.integers(1, 60),  # boundary
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(n_slots=st.integers(1, 4), script=ops)
def test_confirm_keeps_at_most_one_valid_entry_per_slot(n_slots, script):
    table = SlotTable(n_slots, "cfg", frozenset())
    conversations = [[c * 1000 + i for i in range(64)] for c in range(4)]
    for op, conv, b in script:
        if op == "clear":
            table.clear(b % n_slots)
            continue
        ticket = table.prepare(conversations[conv], b, None)
        if op == "confirm":
            table.confirm(ticket, NO_PAGES)
    assert not table.findings()
    for entry in table.entries.values():
        slot = table.slots[entry.slot]
        assert (slot.key, slot.length) == (entry.key, entry.length)


def test_the_fault_lets_stale_entries_pile_up():
    table = SlotTable(2, "cfg", STALE)
    for conv in range(5):
        confirm(table, [conv] * 64, 20 + conv)
    assert len(table.entries) == 5 and table.findings()
