"""Which corpus row explains a failed history: each row's shape, read off the ``Played``.

A history hunt finds failures; a corpus row is a bug someone understood. A
row's ``explains(played, verdict)`` says, from what the history did and what
the checks found, whether that row's bug is what failed, with the evidence (a
sentence naming the requests), or None. It reads only the clients' account
(``histories/play.py``: what each request was sent, where it was after each
step, where it was when its client aborted it, where its session's previous
turn was when a next turn was sent) and the findings, never the engine, so a
label can be checked on a saved history by playing it again.

A history may show several rows; the hunt shrinks a failure once per row it
shows, keeping that row's shape (``hunts/sglang_histories.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from kvwatch.histories.checks import AUDIT, CONTENT, RAISED, HistoryVerdict
from kvwatch.histories.generate import Plan
from kvwatch.histories.ops import TURN
from kvwatch.histories.play import Played
from kvwatch.targets.driver.engine_loop import FINISHED


class Row(NamedTuple):
    id: str  # the corpus row's id (docs/real-bugs.json)
    setups: tuple[str, ...]  # the history setups (targets/sglang/histories.py) that reach it
    explains: Callable[[Played, HistoryVerdict], str | None]
    # the plan it is hunted with: every next turn after its answer, no two turns of a
    # session at one step (which keeps the take crash and the refused-turn shape away)
    plan: Plan = Plan(turns=4, ops_per_turn=12, waits=1.0, same_step_turns=False)


def _carries(seq: Sequence[int], part: Sequence[int]) -> bool:
    """Whether ``part`` (non-empty) occurs in ``seq`` as a run of tokens."""
    n = len(part)
    return n > 0 and any(tuple(seq[i : i + n]) == tuple(part) for i in range(len(seq) - n + 1))


def _own_tokens(played: Played) -> dict[str, tuple[int, ...]]:
    """Each session turn's own new tokens, as its client sent them."""
    return {op.rid: op.tokens for op in played.history.ops if op.kind == TURN}


def _carried_turns(played: Played, verdict: HistoryVerdict) -> Iterator[tuple[str, str]]:
    """(turn, earlier turn) where a ``content`` finding's turn was computed over the
    earlier turn's own tokens, which its client does not expect there."""
    own = _own_tokens(played)
    for f in verdict.findings:
        turn = played.sent.get(f.rid)
        end = played.ended.get(f.rid)
        if f.check != CONTENT or turn is None or not turn.session or end is None:
            continue
        for earlier in played.sent.values():
            if earlier.session != turn.session or earlier.rid == turn.rid:
                continue
            tokens = own.get(earlier.rid, ())
            if _carries(end.input or (), tokens) and not _carries(turn.expected, tokens):
                yield turn.rid, earlier.rid


def retract_commits_session_turn(played: Played, verdict: HistoryVerdict) -> str | None:
    """A retracted turn is committed to its session while it waits: then aborted, its
    tokens reach the next turn (a); or the next turn is taken beside it (b)."""
    for turn, earlier in _carried_turns(played, verdict):
        e = played.ended.get(earlier)
        cut = e is not None and e.status != FINISHED and earlier in played.aborted_in
        if cut and "retracted" in played.stages.get(earlier, ()):
            return (
                f"{turn} was computed over the tokens of {earlier}, which was retracted and "
                f"then aborted by its client ({played.aborted_in[earlier] or 'at once'})"
            )
    if not verdict.findings:
        return None
    for sent in played.sent.values():
        refused = any(op.rid == sent.rid for op, _ in played.refused)
        if sent.beside == "retracted" and not refused:
            return (
                f"{sent.rid} was taken while its session's previous turn waited retracted "
                f"(no 'already has an active request' refusal), and the history failed"
            )
    return None


def mamba_queued_abort_commits_turn(played: Played, verdict: HistoryVerdict) -> str | None:
    """A turn aborted while it waits, never run, is committed to its session (mamba)."""
    for turn, earlier in _carried_turns(played, verdict):
        e = played.ended.get(earlier)
        never_ran = e is not None and e.status != FINISHED and not e.admitted
        retracted = "retracted" in played.stages.get(earlier, ())
        if never_ran and not retracted and played.aborted_in.get(earlier) == "queued":
            return (
                f"{turn} was computed over the tokens of {earlier}, which its client aborted "
                f"while it waited in the queue, never run"
            )
    return None


def mamba_session_first_turn_evict(played: Played, verdict: HistoryVerdict) -> str | None:
    """A session's first turn evicted from the queue by a higher-priority arrival leaves
    its mamba slot held by no one."""
    orphans = [
        f for f in verdict.findings if f.check == AUDIT and f.key.startswith("orphan sglang.mamba")
    ]
    if not orphans:
        return None
    firsts: dict[str, str] = {}
    for sent in played.sent.values():
        if sent.session:
            firsts.setdefault(sent.session, sent.rid)
    for rid in firsts.values():
        e = played.ended.get(rid)
        if e is not None and "higher priority" in e.why:
            return f"{rid}, its session's first turn, was evicted ({e.why!r}) and {orphans[0].key}"
    return None


def audit_finding(verdict: HistoryVerdict, key: str, *words: str) -> str | None:
    """The first audit finding of ``key`` whose text has every one of ``words``."""
    for f in verdict.findings:
        if f.check == AUDIT and f.key.startswith(key) and all(w in f.detail for w in words):
            return f.detail
    return None


def pr_12693(played: Played, verdict: HistoryVerdict) -> str | None:
    """A request aborted while it waits keeps its mamba slot (fixed in 0.5.5)."""
    return audit_finding(verdict, "orphan sglang.mamba", "aborted-in-queue")


def pr_21404(played: Played, verdict: HistoryVerdict) -> str | None:
    """A request that times out in the queue keeps its mamba slot (fixed in 0.5.10)."""
    return audit_finding(verdict, "orphan sglang.mamba", "timed-out")


def pr_22862(played: Played, verdict: HistoryVerdict) -> str | None:
    """A retried turn is written over its session slot's tail without freeing it (0.5.11)."""
    retried = [
        rid
        for rid, trail in played.stages.items()
        if "retracted" in trail and played.sent[rid].session
    ]
    orphan = audit_finding(verdict, "orphan sglang.kv", "SessionSlot row")
    return (
        f"{orphan} (retracted session turns: {', '.join(retried)})" if orphan and retried else None
    )


def pr_23496(played: Played, verdict: HistoryVerdict) -> str | None:
    """Closing a streaming session leaks its slot's mamba state (fixed in 0.5.11)."""
    return audit_finding(verdict, "orphan sglang.mamba", "SessionSlot mamba slot")


def admission_stall(played: Played, verdict: HistoryVerdict) -> str | None:
    """Admission shut for good after a rejection with nothing running (fixed in 0.5.22)."""
    return audit_finding(verdict, "starved", "batch_is_full=True", "running batch is empty")


def same_iteration_session_turns(played: Played, verdict: HistoryVerdict) -> str | None:
    """Two turns of a new streaming session in one scheduler iteration."""
    for f in verdict.findings:
        if f.check == RAISED and f.key.endswith("streaming_session.py in take"):
            return f.detail
    return None


# the rows whose bug is live in the newest release (no fixed release yet)
LIVE = (
    Row(
        id="sglang-retract-commits-session-turn",
        setups=("sessions-retract",),
        explains=retract_commits_session_turn,
    ),
    Row(
        id="sglang-mamba-queued-abort-commits-turn",
        setups=("mamba-sessions",),
        explains=mamba_queued_abort_commits_turn,
    ),
    Row(
        id="sglang-mamba-session-first-turn-evict",
        setups=("mamba-priority",),
        explains=mamba_session_first_turn_evict,
    ),
    Row(  # found with the default plan: next turns sent while the previous one runs
        id="sglang-same-iteration-session-turns",
        setups=("sessions-retract",),
        explains=same_iteration_session_turns,
        plan=Plan(turns=4, ops_per_turn=12),
    ),
)


class FixedRow(NamedTuple):
    row: Row
    buggy: str  # the release with the bug
    fixed: str  # the release with its fix


def _fixed(row: str, setup: str, explains: Callable, buggy: str, fixed: str) -> FixedRow:
    return FixedRow(Row(id=row, setups=(setup,), explains=explains), buggy, fixed)


FIXED = (
    _fixed("sglang-pr-12693", "mamba", pr_12693, "0.5.4.post3", "0.5.5"),
    _fixed("sglang-pr-21404", "mamba", pr_21404, "0.5.9", "0.5.10"),
    _fixed("sglang-pr-22862", "sessions-retract", pr_22862, "0.5.10.post1", "0.5.11"),
    _fixed("sglang-pr-23496", "mamba-sessions", pr_23496, "0.5.10.post1", "0.5.11"),
    _fixed(
        "sglang-admission-stall-empty-batch",
        "sessions-pressure",
        admission_stall,
        "0.5.21",
        "0.5.22",
    ),
)
ROWS = (*LIVE, *(f.row for f in FIXED))


def explained(played: Played, verdict: HistoryVerdict) -> list[tuple[str, str]]:
    """(row id, evidence) for every row whose shape the history shows."""
    out = []
    for row in ROWS:
        if (evidence := row.explains(played, verdict)) is not None:
            out.append((row.id, evidence))
    return out
