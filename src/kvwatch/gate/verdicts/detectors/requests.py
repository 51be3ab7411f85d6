"""requests: every request the load sent got a good answer.

A clean engine answers every well-formed request, and every malformed one
with a 4xx; a load profile marks the answers it expects (a 4xx to bad input,
a stream it cut itself) as successes. So any request the client counted as
failed, and any 5xx, is a finding: a server error, a connection dropped, a
stream that ended without ``[DONE]``. Runs that counted no requests (the
pytest plugin) skip it, and so do runs that broke (the engine stopped
answering): their failed requests are the breakage, which the gate reports
as an error, not as a leak.

Where the run has probes, a request still running many steps after its
client hung up (an ``abandoned`` finding: nothing aborted it, and it spends
the engine's time on tokens nobody reads) fails it too, at the first turn
whose probe shows one; so does a running request that holds pages and has
work left but was passed over by a step with budget to spare (a ``starved``
finding: the scheduler's liveness, vLLM's white-box checks), and so does a
session still open well past its idle timeout (an ``overdue`` finding: the
server's ``--session-idle-timeout`` promise, ``server/overdue.py``).
"""

from __future__ import annotations

from kvwatch.contracts import FindingKind
from kvwatch.gate.verdicts.detectors.verdict import (
    Evidence,
    Verdict,
    fail,
    fail_after_drain,
    findings_detector,
    passed,
    skipped,
)
from kvwatch.harness.run_record import RunRecord, Signal

ID = "requests"
NEEDS = frozenset({Signal.REQUESTS})


def detect(run: RunRecord) -> Verdict:
    owed = {FindingKind.ABANDONED, FindingKind.STARVED, FindingKind.OVERDUE}
    abandoned = findings_detector(ID, owed, run)
    if abandoned.failed:
        return abandoned
    sent = run.requests
    if sent is None:
        return skipped(ID, "no request counts")
    if run.error is not None:  # its failed requests are the breakage, an error (exit 3)
        return skipped(ID, f"the run broke: {run.error}")
    server_errors = sent.status.get("5xx", 0)
    if not sent.errors and not server_errors:
        return passed(ID, f"{sent.requests} requests, none failed, no 5xx")
    ev = [
        Evidence(
            group=None,
            pages=(),
            detail=f"{sent.errors} of {sent.requests} requests failed, {server_errors} answered 5xx "
            f"(by status: {dict(sorted(sent.status.items()))})",
        )
    ]
    ev += [Evidence(group=None, pages=(), detail=failure_line(f)) for f in sent.first_failures]
    turn = _first_turn(run)
    return fail(ID, turn, ev) if turn is not None else fail_after_drain(ID, run, ev)


def failure_line(failure: dict) -> str:
    """One kept failure as a line: ``chat turn: no answer (ConnectError: ...)`` or
    ``chat turn: HTTP 500 {"error": ...}``."""
    status = failure.get("status") or 0
    answer = f"HTTP {status}" if status else "no answer"
    error = failure.get("error") or ""
    body = " ".join(str(failure.get("body") or "").split())[:200]
    tail = " ".join(part for part in (f"({error})" if error else "", body) if part)
    return f"{failure.get('name')}: {answer}" + (f" {tail}" if tail else "")


def _first_turn(run: RunRecord) -> int | None:
    """The first barrier whose counts so far hold a failure or a 5xx; None for
    failures counted only at the end (closing sessions, the drain)."""
    for turn in run.turns:
        sent = turn.requests
        if sent is not None and (sent.errors or sent.status.get("5xx", 0)):
            return turn.turn
    return None
