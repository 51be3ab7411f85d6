"""Play a ``History`` on an ``EngineLoop``: what each request was sent, computed and gave.

``play(loop, probe, history)`` runs each turn's operations at their steps
(``driver/workload.Schedule``), the loop to idle after each turn, then
closes what is still open, flushes and probes once more. Beside the loop it
keeps the clients' own account, the one the checks (``checks.py``) hold the
engine to:

* ``sent``: every request that reached the engine, and the input its client
  expects the engine to compute over: the prompt, or for a session turn the
  session's committed turns and the turn's new tokens. What a session
  commits is the loop's rule (``session_keeps``): a finished turn's input
  and output; with ``"ran"``, also a turn cut after it ran, to where it got;
  with ``"finished-less-last"``, a finished turn's but its last token. Where
  the loop queues a next turn behind a live one (``session_queues_turns``),
  that turn builds on what the session committed once the ones before ended;
* ``ended``: how and when each request ended, what it was computed over
  (``input_of``), what it found cached (``hit_of``) and what it generated;
* ``refused``: operations the engine turned down at once (a 4xx);
* ``stages``: where each request was after each step, as the loop names it
  (``stage``: queued, prefilling, decoding, retracted, ...), each change once;
  the stage a request was in when its client aborted it (``aborted_in``), and
  for a session turn, where the session's previous turn was when it was sent
  (``Sent.beside``: "" when that one had ended);
* ``reports``: the probe's reports with findings, after every step (the
  first few, ``StepProbe``), at every barrier and after the final flush;
* ``cache_log``: where the target gives a ``CacheWatch``, its log (the
  index's events, the references taken and given, the index and refs after
  every step and after the final flush).

An exception the engine raises ends the history there (``error``, naming
the frame), and so does an engine that never gets idle though its clients
gave up (``stuck``); what was recorded until then is still checked.

Invariant: the loop is changed only by the history's operations, in their
order, and the closing ones every history ends with (close, drain, flush).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

from kvwatch.contracts import ProbeReport
from kvwatch.histories.ops import ABORT, CLOSE, FLUSH, OPEN, SUBMIT, TURN, WAITING, History, Op
from kvwatch.targets.driver.cache_watch import CacheWatch, Entry
from kvwatch.targets.driver.engine_loop import FINISHED, EngineLoop, Refused
from kvwatch.targets.driver.step_probe import StepProbe
from kvwatch.targets.driver.workload import IdleRule, Schedule, Stuck, run_until_idle

RULE = IdleRule(
    max_steps=5_000,
    stuck="the engine did not get idle in {n} steps",
    give_up=True,
    give_up_each=True,  # a turn sent after the first give-up is given up on at its stall
)


class Sent(NamedTuple):
    rid: str
    turn: int
    session: str  # "" outside a session
    expected: tuple[int, ...]  # the input its client expects the engine to compute over
    max_new: int
    beside: str = ""  # a session turn: the stage its session's previous turn was in ("": ended)


class Ended(NamedTuple):
    rid: str
    status: str  # FINISHED, ABORTED or the engine's own
    step: int
    input: tuple[int, ...] | None  # what the engine computed it over (None: unread)
    output: tuple[int, ...]
    why: str = ""
    hit: int | None = None  # prompt tokens found cached at admission (None: unread, or never)
    admitted: bool = True  # the engine ran it (a step computed some of it)


@dataclass
class Played:
    history: History
    sent: dict[str, Sent] = field(default_factory=dict)
    ended: dict[str, Ended] = field(default_factory=dict)
    refused: list[tuple[Op, str]] = field(default_factory=list)
    stages: dict[str, list[str]] = field(default_factory=dict)  # rid -> stages, in order
    aborted_in: dict[str, str] = field(default_factory=dict)  # rid -> its stage at the abort
    reports: list[tuple[str, ProbeReport]] = field(default_factory=list)  # (where, report)
    final: ProbeReport | None = None
    error: str = ""
    error_at: str = ""  # the exception and where it was raised, without a line number
    stuck: str = ""  # the engine never got idle (``driver.workload.Stuck``)
    steps: int = 0
    cache_log: tuple[Entry, ...] | None = None  # None: the target keeps no cache watch
    cache_tells: frozenset[str] = frozenset()  # what the watch records (``CacheWatch.tells``)


class _Clients:
    """The clients' side: their operations on the loop and their account of it."""

    def __init__(self, loop: EngineLoop, played: Played) -> None:
        self.loop, self.played = loop, played
        # sessions' committed tokens (kept past a close: turns still queued build on them)
        self.committed: dict[str, tuple[int, ...]] = {}
        self.closed: set[str] = set()
        self.seen = 0  # outcomes taken into the account so far
        self.rids = {op.rid for op in played.history.ops if op.kind in (SUBMIT, TURN)}
        self.sent_at: dict[str, int] = {}  # the loop's steps when each request was sent
        # turns sent behind a live one of their session, where the loop queues them
        # (``session_queues_turns``): their expected input waits for the ones before
        self.behind: dict[str, tuple[int, ...]] = {}
        # a loop calls its observers after every step and abort: a request may end in either
        loop.observers.append(self.take_outcomes)
        loop.observers.append(self.take_stages)

    def apply(self, op: Op, schedule: Schedule) -> None:
        """Run ``op`` now, or once the request it waits for (``after``) ended or was
        refused: a request of this history, sent already or itself still waiting."""
        if op.after and op.after in self.rids and not self.settled(op.after):
            due = partial(self.settled, op.after)
            schedule.once(due, partial(self.apply, op._replace(after=""), schedule))
            return
        loop, sent = self.loop, self.played.sent
        if op.kind in (SUBMIT, TURN):
            self.sent_at[op.rid] = loop.steps
        try:
            options = {} if op.priority is None else {"priority": op.priority}
            if op.kind == SUBMIT:
                loop.submit(op.rid, list(op.tokens), op.max_new, **options)
                sent[op.rid] = Sent(
                    rid=op.rid, turn=op.turn, session="", expected=op.tokens, max_new=op.max_new
                )
            elif op.kind == TURN:
                beside = self.stage_of_previous(op.session)
                loop.submit(op.rid, list(op.tokens), op.max_new, session_id=op.session, **options)
                closed = op.session in self.closed  # a turn on a closed session: from nothing
                base = () if closed else self.committed.get(op.session, ())
                sent[op.rid] = Sent(
                    rid=op.rid,
                    turn=op.turn,
                    session=op.session,
                    expected=base + op.tokens,
                    max_new=op.max_new,
                    beside=beside,
                )
                if beside and loop.session_queues_turns:  # built on once those before end
                    self.behind[op.rid] = op.tokens
            elif op.kind == OPEN:
                loop.open_session(op.session)
                self.committed[op.session] = ()
                self.closed.discard(op.session)
            elif op.kind == CLOSE:
                loop.close_session(op.session)
                self.closed.add(op.session)
            elif op.kind == FLUSH:
                loop.flush()
            elif op.kind == ABORT and op.rid in sent and op.rid not in self.played.ended:
                due = partial(self.reached, op.rid, op.stage)
                if not op.stage or due():  # at once, or already where it waits for it
                    self.abort(op.rid)
                else:
                    schedule.once(due, partial(self.abort, op.rid))
        except Refused as exc:
            self.played.refused.append((op, str(exc)))

    def open_sessions(self) -> list[str]:
        return [sid for sid in self.committed if sid not in self.closed]

    def settled(self, rid: str) -> bool:
        """Whether the request ``rid`` ended, or was refused when sent."""
        return rid in self.played.ended or any(op.rid == rid for op, _ in self.played.refused)

    def abort(self, rid: str) -> None:
        if rid not in self.played.ended:
            self.played.aborted_in[rid] = self.loop.stage(rid) or ""
            self.loop.abort(rid)

    def reached(self, rid: str, stage: str) -> bool:
        """Whether ``rid`` is in ``stage`` now (``waiting``: still queued after a step
        since it was sent, so the engine looked at it and held it back)."""
        now = self.loop.stage(rid)
        if stage == WAITING:
            return now == "queued" and self.loop.steps > self.sent_at.get(rid, self.loop.steps)
        return now == stage

    def stage_of_previous(self, session: str) -> str:
        """Where the session's last turn sent before now is, "" once it ended."""
        turns = [s.rid for s in self.played.sent.values() if s.session == session]
        if not turns or turns[-1] in self.played.ended:
            return ""
        return self.loop.stage(turns[-1]) or ""

    def take_stages(self) -> None:
        """(A loop observer.) Where each live request is now, where that changed."""
        stages, ended = self.played.stages, self.played.ended
        for rid in self.played.sent:
            if rid not in ended and (now := self.loop.stage(rid)):
                trail = stages.setdefault(rid, [])
                if not trail or trail[-1] != now:
                    trail.append(now)

    def take_outcomes(self) -> None:
        """(A loop observer.) Each request that ended since the last look: into ``ended``, and its
        session's committed tokens moved on where the loop's rule says so."""
        loop = self.loop
        for out in loop.outcomes[self.seen :]:
            rid = str(out.rid)
            output = tuple(loop.output_of(out.rid))
            self.played.ended[rid] = Ended(
                rid=rid,
                status=out.status,
                step=out.step,
                input=loop.input_of(out.rid),
                output=output,
                why=out.why,
                hit=loop.hit_of(out.rid),
                admitted=loop.admitted(out.rid),
            )
            sent = self.played.sent.get(rid)
            if sent is None or not sent.session or sent.session not in self.committed:
                continue
            kept = out.status == FINISHED or (
                loop.session_keeps == "ran" and loop.admitted(out.rid)
            )
            if kept:
                less_last = loop.session_keeps == "finished-less-last"
                self.committed[sent.session] = sent.expected + (
                    output[:-1] if less_last else output
                )
            self.move_up(sent.session)
        self.seen = len(loop.outcomes)

    def move_up(self, session: str) -> None:
        """A turn queued behind its session's previous ones, once every one of those
        ended: it builds on what the session committed by then."""
        sent, ended = self.played.sent, self.played.ended
        for rid in [r for r in self.behind if sent[r].session == session]:
            before = [s.rid for s in sent.values() if s.session == session]
            if any(r not in ended for r in before[: before.index(rid)]):
                return
            expected = self.committed.get(session, ()) + self.behind.pop(rid)
            sent[rid] = sent[rid]._replace(expected=expected)


def _where(exc: BaseException) -> tuple[str, str]:
    """The exception with the frame it came from, and the same without a line number."""
    frame = traceback.extract_tb(exc.__traceback__)[-1]
    at = f"{type(exc).__name__} {frame.filename} in {frame.name}"
    return f"{type(exc).__name__}: {exc} (at {frame.filename}:{frame.lineno} in {frame.name})", at


def _turn(clients: _Clients, probe: StepProbe, ops: list[Op], label: str) -> None:
    schedule = Schedule()
    for op in ops:
        schedule.before_step(op.at, partial(clients.apply, op, schedule))
    run_until_idle(clients.loop, schedule, RULE)
    played = clients.played
    played.reports.extend((f"{label}, mid-turn", r) for r in probe.latched())
    report = probe.report()
    if report.findings:
        played.reports.append((f"{label}, barrier", report))


def play(
    loop: EngineLoop, probe: StepProbe, history: History, watch: CacheWatch | None = None
) -> Played:
    """Every turn of ``history`` on ``loop``, then the close: sessions closed, the loop
    drained and flushed, a final probe (and a final look of the ``watch``)."""
    played = Played(history=history)
    clients = _Clients(loop, played)
    probe.watch()
    try:
        for t in range(history.turns):
            _turn(clients, probe, history.of_turn(t), f"turn {t}")
        closing = [
            Op(turn=history.turns, at=0, kind=CLOSE, session=sid) for sid in clients.open_sessions()
        ]
        _turn(clients, probe, closing, "close")
        if not loop.flush():
            played.error = "the cache flush was refused with nothing live"
        played.final = probe.report()
        if watch is not None:
            watch.look("the end")
    except Stuck as exc:  # requests that never end, though their clients gave up
        live = ", ".join(str(rid) for rid in loop.live_rids()[:4])
        played.stuck = f"{exc} (still live after its clients gave up: {live or 'none'})"
    except Exception as exc:  # the engine broke: check what was recorded
        played.error, played.error_at = _where(exc)
    played.steps = loop.steps
    played.cache_log = tuple(watch.log) if watch is not None else None
    played.cache_tells = watch.tells if watch is not None else frozenset()
    return played
