"""allocator: ownership findings, usage above the bound live holders justify,
state usage that grows with turns, and usage that does not drain.

* Orphans, double ownership and free-and-owned pages fail at once.
* A probe whose bound is exceeded fails: history is about ceil(context / P)
  per holder plus slack; state is O(1) snapshots per live holder.
* Interior snapshots per live conversation at the barrier must not trend
  upward with turns (Theil–Sen and Kendall after the warm-up): leaves keep
  their terminal snapshots as cache, but a path keeps O(1) snapshots, never
  one more per turn.
* After sessions close and the cache is flushed, every pool is back where it
  started.
"""

from __future__ import annotations

from kvwatch.contracts import OWNERSHIP
from kvwatch.instrumentation.detectors.base import Evidence, Verdict, fail, passed
from kvwatch.instrumentation.detectors.stats import first_rise
from kvwatch.instrumentation.record import RunRecord

ID = "allocator"


def detect(run: RunRecord) -> Verdict:
    for turn in run.turns:
        for probe in turn.probes:
            hits = [f for f in probe.findings if f.kind in OWNERSHIP]
            if hits:
                return fail(ID, turn.turn, [Evidence(f.group, f.pages, f.detail) for f in hits])
            over = [
                Evidence(
                    b.group,
                    (),
                    f"{b.pinned} pinned pages, live holders ({b.holders}) justify {b.limit}",
                )
                for b in probe.exceeded()
            ]
            if over:
                return fail(ID, turn.turn, over)
    if (rise := _state_trend(run)) is not None:
        return rise
    if (leftover := _drain(run)) is not None:
        return leftover
    return passed(ID, f"{len(run.turns)} turns within bounds, state flat, drained to baseline")


def interior_per_conversation(run: RunRecord) -> dict[str, list[float]]:
    """Per state group: interior snapshots (on nodes with children) per live
    conversation at each barrier. Leaves may keep their terminal snapshots as
    cache; superseded interior ones are what seed 000 leaks."""
    out: dict[str, list[float]] = {}
    for turn in run.turns:
        if turn.barrier is None:
            continue
        for group, count in turn.barrier.tree.interior_snapshots.items():
            out.setdefault(group, []).append(count / max(turn.conversations, 1))
    return out


def _state_trend(run: RunRecord) -> Verdict | None:
    turns = [t.turn for t in run.turns]
    for group, series in interior_per_conversation(run).items():
        rise = first_rise(turns, series, run.warmup)
        if rise is not None:
            at, trend = rise
            detail = (
                f"interior snapshots per live conversation grow with turns "
                f"({series[0]:.1f} -> {series[-1]:.1f}): {trend.describe}"
            )
            return fail(ID, at, [Evidence(group, (), detail)])
    return None


def _drain(run: RunRecord) -> Verdict | None:
    if run.drained is None or run.baseline is None:
        return None
    left = []
    for group, g in run.drained.groups.items():
        used, was = g.used, run.baseline.groups[group].used
        if used > was:
            owners = {k: v for k, v in g.by_owner.items() if v}
            left.append(
                Evidence(
                    group,
                    (),
                    f"{used} pages used after drain, {was} before the run; by owner {owners}",
                )
            )
    if left:
        return fail(ID, run.turns[-1].turn + 1 if run.turns else 0, left)
    return None
