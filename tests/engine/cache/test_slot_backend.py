"""The snapshot-slot backend against seed 004's deterministic sequence.

Two slots. A short conversation snapshots into slot 0; a tiny one has a
degenerate boundary, so its snapshot aborts and burns slot 1's step; a big,
unrelated conversation then wraps onto slot 0 while the first conversation's
entry still points there. Two follow-ups of the first conversation come
next: one shorter than the big snapshot, one longer::

    slot 0   A[:bA] ──────────► B[:bB]         (bB > len(A short follow-up))
    slot 1        (T burns it)       ► A[:bA]   (fixed engine only)

Fixed, the wrap erases A's entry: the short follow-up is a clean miss that
snapshots A again into slot 1, and the long follow-up restores that valid
snapshot. With ``stale-slot-entry`` the entry survives the wrap, the short
follow-up misses because slot 0 is longer than its prompt, and the long
follow-up restores B's state under A's tokens: silent corruption.
"""

from __future__ import annotations

from conversations import PARAMS, oracle

from kvwatch.contracts import FindingKind
from kvwatch.engine import CacheConfig, Engine, EngineConfig
from kvwatch.engine.config import PrefixCacheMode
from kvwatch.engine.events import (
    SlotAborted,
    SlotConfirmed,
    SlotMissed,
    SlotPrepared,
    SlotRestored,
)
from kvwatch.engine.faults import Fault
from kvwatch.engine.model.tokenizer import ChatMessage, ChatTemplate, last_turn_start

SLOT_EVENTS = (SlotPrepared, SlotConfirmed, SlotAborted, SlotRestored, SlotMissed)
TEMPLATE = ChatTemplate()


def render(*messages: tuple[str, str]) -> list[int]:
    return TEMPLATE.render([ChatMessage(r, c) for r, c in messages])


def follow_up(history: list[int], text: str) -> list[int]:
    """``history`` plus a new user message (its rendering minus the BOS)."""
    return history + render(("user", text))[1:]


def seed_sequence() -> dict[str, list[int]]:
    a = render(
        ("system", "You are a careful assistant for a storage team."),
        ("user", "Which pool holds the window?"),
        ("assistant", "The swa pool holds it."),
        ("user", "And the state?"),
    )
    big = render(
        ("system", "Summarise the logs. " * 8),
        ("user", "log line " * 20),
        ("assistant", "ok " * 10),
        ("user", "next"),
    )
    history = a[: last_turn_start(a)]
    return {
        "short conversation": a,
        "tiny conversation": render(("user", "hi")),
        "big conversation": big,
        "shortened follow-up": follow_up(history, "Short?"),
        "longer follow-up": follow_up(history, "Tell me all about the state pool. " * 9),
    }


def run_sequence(faults: frozenset[Fault] = frozenset()):
    engine = Engine(
        EngineConfig(cache=CacheConfig(mode=PrefixCacheMode.SLOTS, slots=2), faults=faults)
    )
    events: list = []
    for kind in SLOT_EVENTS:
        engine.events.subscribe(kind, events.append)
    steps = []
    for name, prompt in seed_sequence().items():
        start = len(events)
        out = engine.generate([prompt], PARAMS)[0]
        assert out.error is None, out.error
        steps.append((name, prompt, out.token_ids, events[start:], engine.probe()))
    return steps


def test_sequence_shape():
    seq = seed_sequence()
    b_a = last_turn_start(seq["short conversation"])
    b_big = last_turn_start(seq["big conversation"])
    assert last_turn_start(seq["tiny conversation"]) < CacheConfig().slot_min_tokens <= b_a
    assert len(seq["shortened follow-up"]) - 1 < b_big < len(seq["longer follow-up"]) - 1


def test_fixed_engine_misses_cleanly_then_restores_a_valid_snapshot():
    steps = {name: (out, ev, probe) for name, _, out, ev, probe in run_sequence()}
    seq = seed_sequence()
    b_a = last_turn_start(seq["short conversation"])

    _, ev, _ = steps["short conversation"]
    assert [type(e) for e in ev] == [SlotPrepared, SlotConfirmed] and ev[0].slot == 0
    _, ev, _ = steps["tiny conversation"]
    assert ev == [SlotPrepared(2, 1, 1), SlotAborted(2, 1, "degenerate boundary")]
    _, ev, _ = steps["big conversation"]
    assert ev[-1].slot == 0 and ev[-1].stale_erased == 1  # the wrap drops A's entry
    _, ev, _ = steps["shortened follow-up"]
    assert not [e for e in ev if isinstance(e, SlotRestored | SlotMissed)]  # a clean miss
    assert [e.slot for e in ev if isinstance(e, SlotConfirmed)] == [1]
    _, ev, _ = steps["longer follow-up"]
    restored = [e for e in ev if isinstance(e, SlotRestored)]
    assert [(e.slot, e.length) for e in restored] == [(1, b_a)]

    for name, prompt, output, _, probe in run_sequence():
        assert output == oracle(prompt), f"{name}: output differs from the cache-off baseline"
        assert probe.clean, (name, probe.findings)


def test_stale_slot_entry_reproduces_the_silent_corruption():
    steps = run_sequence(frozenset({Fault.STALE_SLOT_ENTRY}))
    by_name = {name: (prompt, out, ev, probe) for name, prompt, out, ev, probe in steps}
    _, _, ev, probe = by_name["big conversation"]
    assert ev[-1].stale_erased == 0
    kinds = {f.kind for f in probe.findings}
    assert kinds == {FindingKind.SLOT_TABLE}, probe.findings
    assert any("2 entries" in f.detail for f in probe.findings)

    prompt, out, ev, _ = by_name["shortened follow-up"]
    assert [e.reason for e in ev if isinstance(e, SlotMissed)] == [
        "snapshot longer than the prompt"
    ]
    assert out == oracle(prompt)  # the shorter prompt is only a missed opportunity

    prompt, out, ev, _ = by_name["longer follow-up"]
    b_big = last_turn_start(seed_sequence()["big conversation"])
    assert [(e.slot, e.length) for e in ev if isinstance(e, SlotRestored)] == [(0, b_big)]
    assert out != oracle(prompt), "restoring another conversation's KV went unnoticed"


def test_flush_empties_every_slot():
    engine = Engine(EngineConfig(cache=CacheConfig(mode=PrefixCacheMode.SLOTS)))
    seq = seed_sequence()
    engine.generate([seq["short conversation"], seq["big conversation"]], PARAMS)
    assert engine.probe().slots.filled == 2
    engine.flush_cache()
    report = engine.probe()
    assert report.slots.filled == 0 and report.slots.entries == 0
    assert all(g.by_owner["slot"] == 0 for g in report.groups.values())
    assert report.clean, report.findings
