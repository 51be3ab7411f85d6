"""requests: every request the load sent got a good answer.

A clean engine answers every well-formed request, and every malformed one
with a 4xx; a load profile marks the answers it expects (a 4xx to bad input,
a stream it cut itself) as successes. So any request the client counted as
failed, and any 5xx, is a finding: a server error, a connection dropped, a
stream that ended without ``[DONE]``. Runs that counted no requests (the
pytest plugin) skip it.
"""

from __future__ import annotations

from kvwatch.instrumentation.detectors.base import Evidence, Verdict, fail, passed, skipped
from kvwatch.instrumentation.record import RunRecord

ID = "requests"


def detect(run: RunRecord) -> Verdict:
    sent = run.requests
    if sent is None:
        return skipped(ID, "no request counts")
    server_errors = sent.status.get("5xx", 0)
    if not sent.errors and not server_errors:
        return passed(ID, f"{sent.requests} requests, none failed, no 5xx")
    ev = [
        Evidence(
            None,
            (),
            f"{sent.errors} of {sent.requests} requests failed, {server_errors} answered 5xx "
            f"(by status: {dict(sorted(sent.status.items()))})",
        )
    ]
    ev += [
        Evidence(
            None, (), f"{f.get('name')}: HTTP {f.get('status')} {str(f.get('body', ''))[:200]}"
        )
        for f in sent.first_5xx
    ]
    return fail(ID, _first_turn(run), ev)


def _first_turn(run: RunRecord) -> int:
    """The first barrier whose counts so far hold a failure or a 5xx; failures
    counted only at the end belong after the last turn."""
    for turn in run.turns:
        sent = turn.requests
        if sent is not None and (sent.errors or sent.status.get("5xx", 0)):
            return turn.turn
    return run.turns[-1].turn + 1 if run.turns else 0
