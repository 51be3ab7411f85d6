"""The history checkers: what a played history must show, each its own finding kind.

Each checker reads a ``Played`` (``play.py``) and nothing else, and returns
``HistoryFinding``s of its own ``check``:

``content``      every request the engine computed over exactly what its client
                 sent: a prompt as sent; a session turn over its session's
                 committed turns and its own new tokens, nothing of a turn
                 that was aborted, refused or never committed. And every cache
                 hit holds the request's own tokens: the cache holds only what
                 requests computed, so the first ``hit`` tokens of a request
                 found cached must begin some other request's input and output
``equivalence``  every finished request gave the tokens a cache-off engine gives
                 for the same input (where the target has one)
``audit``        no probe report with a finding (notices aside): after every
                 step (the first few), at every barrier, after the final flush
``ended``        no request the engine ended without being asked
``drained``      after the sessions closed, the loop drained and the cache
                 flushed, every page of every group is free
``index``        the cache index's events agree with a model of the index and with
                 the index itself after every step (``cache_checks.py``)
``references``   every reference taken for a holder is given back by the time its
                 request ends, and every node's count is what the log implies
                 (``cache_checks.py``)
``raised``       the engine raised nothing
``stuck``        the engine got idle: no request lives on after its clients gave up

A checker that cannot run on a target (no cache-off engine, inputs the loop
cannot read) is listed in ``HistoryVerdict.skipped`` with the reason, never
counted as a pass.

Invariant: a checker only reads; the same ``Played`` gives the same findings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from kvwatch.contracts import SEVERE
from kvwatch.harness.run_record import Candidate
from kvwatch.histories import cache_checks
from kvwatch.histories.cache_checks import INDEX, REFERENCES
from kvwatch.histories.play import Played
from kvwatch.targets.driver.engine_loop import FINISHED
from kvwatch.targets.driver.history_target import Reference

CONTENT, EQUIVALENCE, AUDIT, ENDED, DRAINED, RAISED, STUCK = (
    "content", "equivalence", "audit", "ended", "drained", "raised", "stuck"
)  # fmt: skip
CHECKS = (CONTENT, EQUIVALENCE, INDEX, REFERENCES, AUDIT, ENDED, DRAINED, RAISED, STUCK)


class HistoryFinding(NamedTuple):
    check: str  # one of CHECKS
    detail: str
    rid: str = ""  # the request it is about, where it is about one
    # what makes two findings of the check the same bug for the shrinker: an audit
    # finding's kind and group; a raise's exception and where (no line number)
    key: str = ""


def signature(finding: HistoryFinding) -> str:
    """The check and its ``key``: equal for the same bug in two histories."""
    return f"{finding.check} {finding.key}".rstrip()


class HistoryVerdict(NamedTuple):
    findings: tuple[HistoryFinding, ...]
    skipped: tuple[tuple[str, str], ...]  # (check, why it could not run)

    @property
    def failed(self) -> frozenset[str]:
        return frozenset(f.check for f in self.findings)

    @property
    def primary(self) -> str | None:
        """The bug a shrink keeps: the first raise's signature, else the first finding's."""
        raised = [f for f in self.findings if f.check == RAISED]
        first = (raised or list(self.findings))[:1]
        return signature(first[0]) if first else None

    def shows(self, wanted: str) -> bool:
        return any(signature(f) == wanted for f in self.findings)


def _parts(a: Sequence[int], b: Sequence[int]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def content(played: Played) -> list[HistoryFinding]:
    out = []
    for rid, end in played.ended.items():
        sent = played.sent.get(rid)
        if sent is None or end.input is None or not end.admitted or end.input == sent.expected:
            continue  # a request the engine never ran computed over nothing
        where = f"turn of session {sent.session}" if sent.session else "request"
        out.append(
            HistoryFinding(
                check=CONTENT,
                detail=f"{rid} ({where}) was computed over {len(end.input)} tokens where its client "
                f"expects {len(sent.expected)}; they part at token "
                f"{_parts(end.input, sent.expected)}",
                rid=rid,
            )
        )
    return out


def _computed(played: Played) -> list[tuple[str, tuple[int, ...]]]:
    return [(rid, e.input + e.output) for rid, e in played.ended.items() if e.input is not None]


def hits(played: Played) -> list[HistoryFinding]:
    """Every request's cache hit against what the other requests computed."""
    out, computed = [], _computed(played)
    for rid, e in played.ended.items():
        if not e.hit or e.input is None:
            continue
        want = e.input[: e.hit]
        best = max((_parts(seq, want) for other, seq in computed if other != rid), default=0)
        if best < e.hit:
            out.append(
                HistoryFinding(
                    check=CONTENT,
                    detail=f"{rid} found {e.hit} prompt tokens cached, but no request computed more "
                    f"than its first {best}: the cache gave it pages of other tokens",
                    rid=rid,
                )
            )
    return out


def equivalence(played: Played, reference: Reference) -> list[HistoryFinding]:
    finished = [
        (
            rid,
            Candidate(
                turn=played.sent[rid].turn,
                prompt=e.input,
                output=e.output,
                max_tokens=played.sent[rid].max_new,
            ),
        )
        for rid, e in played.ended.items()
        if e.status == FINISHED and e.input is not None and rid in played.sent
    ]
    replays = reference([c for _, c in finished])
    return [
        HistoryFinding(
            check=EQUIVALENCE,
            detail=f"{rid} gave {len(r.cached)} tokens that part from a cache-off engine's at token "
            f"{_parts(r.cached, r.reference)} (prompt {len(r.prompt)} tokens)",
            rid=rid,
        )
        for (rid, _), r in zip(finished, replays, strict=True)
        if r.cached != r.reference
    ]


def audit(played: Played) -> list[HistoryFinding]:
    out, seen = [], set()
    reports = [*played.reports, *([("final", played.final)] if played.final else [])]
    for where, report in reports:
        for f in report.findings:
            if f.severity != SEVERE:  # a notice: its engine holds it harmless
                continue
            key = (f.kind, f.group, f.key or f.detail)
            if key not in seen:
                seen.add(key)
                detail = f"{where}: {f.kind} {f.group or ''}: {f.detail}"
                out.append(
                    HistoryFinding(check=AUDIT, detail=detail, key=f"{f.kind} {f.group or ''}")
                )
    return out


def ended(played: Played, unasked: str) -> list[HistoryFinding]:
    return [
        HistoryFinding(
            check=ENDED,
            detail=f"{rid} ended by the engine unasked at step {e.step}: {e.why}",
            rid=rid,
        )
        for rid, e in played.ended.items()
        if e.status == unasked
    ]


def drained(played: Played) -> list[HistoryFinding]:
    if played.final is None:
        return []
    return [
        HistoryFinding(
            check=DRAINED,
            detail=f"after the close and the flush {name} holds {g.capacity - g.free} of "
            f"{g.capacity} pages (by owner {g.by_owner})",
        )
        for name, g in played.final.stats.groups.items()
        if g.free != g.capacity
    ]


def from_log(played: Played) -> list[HistoryFinding]:
    """The ``index`` and ``references`` checks over the target's cache log."""
    log, tells = played.cache_log or (), played.cache_tells
    sessions = {rid: s.session for rid, s in played.sent.items() if s.session}
    found = [
        *(cache_checks.index(log) if INDEX in tells else ()),
        *(cache_checks.references(log, sessions) if REFERENCES in tells else ()),
    ]
    return [HistoryFinding(check=f.check, detail=f.detail, rid=f.rid, key=f.key) for f in found]


def judge(played: Played, unasked: str, reference: Reference | None) -> HistoryVerdict:
    """Every checker over ``played``; equivalence only with a ``reference``, index and
    references only with a cache log."""
    findings = [
        *content(played),
        *hits(played),
        *from_log(played),
        *audit(played),
        *ended(played, unasked),
        *drained(played),
    ]
    skipped = []
    if played.error:
        findings.append(HistoryFinding(check=RAISED, detail=played.error, key=played.error_at))
    if played.stuck:
        findings.append(HistoryFinding(check=STUCK, detail=played.stuck))
    if played.cache_log is None:
        why = "the target tells neither its cache index's events nor its references"
        skipped.extend([(INDEX, why), (REFERENCES, why)])
    elif REFERENCES not in played.cache_tells:
        why = "the target's cache takes references without naming the request they are for"
        skipped.append((REFERENCES, why))
    elif INDEX not in played.cache_tells:
        skipped.append((INDEX, "the target's cache tells no index events"))
    if reference is None:
        skipped.append((EQUIVALENCE, "the target has no cache-off engine"))
    else:
        findings.extend(equivalence(played, reference))
    if any(e.input is None and e.admitted for e in played.ended.values()):
        skipped.append((CONTENT, "the loop cannot read what some requests computed over"))
    if played.ended and all(e.hit is None for e in played.ended.values()):
        skipped.append((CONTENT, "cache hits: the loop cannot read what a request found cached"))
    return HistoryVerdict(tuple(findings), tuple(skipped))
