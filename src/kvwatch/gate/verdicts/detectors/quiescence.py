"""quiescence: once the run is over, the engine and its server are back where they began.

The recorder drains the engine, the users close every session, and the
cache is flushed; then, against the probe taken before the run:

* every group's host tier holds no more pages (device pools are the
  allocator's drain rule);
* the root's ref count is no higher: nothing still locks a path;
* every registry (``kvwatch.instrumentation.registries``: each container the engine, the
  server and their listeners hold, found by walking them) holds no more
  entries. A request table, a stream map, a listener's open spans or a
  module-level map that keeps one entry per request or session is named by
  its attribute path.

It knows nothing of any particular bug: whatever a request or a session
leaves behind once it is gone shows up here. Coming back lower is fine (a
flush may drop cache the baseline held).

It also fails on a ``listener`` finding in any probe of the run: an event
handler (a metric, a span, a lifecycle count, the session clock) raised. The
engine isolates such failures so they cannot change what it serves, which
leaves the listener's own state behind its events; this is where that is
seen, at the first turn whose probe reports it. Likewise on a ``registry``
finding: a container whose class declares a bound (``__bounded__``, so the
comparison above leaves it out) held more than that, or is a deque that
would.
"""

from __future__ import annotations

from kvwatch.contracts import FindingKind
from kvwatch.gate.verdicts.detectors.verdict import (
    Evidence,
    Verdict,
    fail_after_drain,
    findings_detector,
    not_back,
    passed,
    skipped,
    unjudged,
)
from kvwatch.harness.run_record import RunRecord, Signal

ID = "quiescence"
NEEDS = frozenset({Signal.PROBES, Signal.REGISTRIES})
HOST = "host"


def detect(run: RunRecord) -> Verdict:
    listeners = findings_detector(ID, {FindingKind.LISTENER, FindingKind.REGISTRY}, run)
    if listeners.failed:
        return listeners
    if run.drained is None or run.baseline is None:
        return skipped(ID, "no probes before and after the run")
    if why := unjudged(run):
        return skipped(ID, why)
    base, after = run.baseline, run.drained
    left = [
        Evidence(
            group=group,
            pages=(),
            detail=f"{now:.0f} host-tier pages after the run, {was:.0f} before",
        )
        for group, was, now in not_back(
            {g: v.by_owner.get(HOST, 0) for g, v in base.groups.items()},
            {g: v.by_owner.get(HOST, 0) for g, v in after.groups.items()},
        )
    ]
    if after.root_refs.actual > base.root_refs.actual:
        left.append(
            Evidence(
                group=None,
                pages=(),
                detail=f"the root holds {after.root_refs.actual} refs after the run, "
                f"{base.root_refs.actual} before",
            )
        )
    if base.registries:  # a probe that reports no registries (an engine's own) is not judged
        before = {name: base.registries.get(name, 0) for name in after.registries}
        left += [
            Evidence(
                group=None,
                pages=(),
                detail=f"{name} holds {now:.0f} entries after the run, {was:.0f} before",
            )
            for name, was, now in not_back(before, after.registries)
        ]
    if left:
        return fail_after_drain(ID, run, left)
    checked = f", {len(after.registries)} registries" if base.registries else ""
    return passed(ID, f"host tier, root refs{checked} back at their starting values")
