"""allocator: ownership findings, usage above the bound live holders justify,
state usage that grows with turns, and usage that does not drain.

* Orphans, double ownership and free-and-owned pages fail at once.
* A probe whose bound is exceeded fails: history is about ceil(context / P)
  per holder plus slack; state is O(1) snapshots per live holder.
* Interior snapshots per live conversation at the barrier must not trend
  upward with turns (Theil–Sen and Kendall after the warm-up): leaves keep
  their terminal snapshots as cache, but a path keeps O(1) snapshots, never
  one more per turn.
* A soak's pinned pages per group stay below capacity and do not grow over
  whole episodes (``usage_trend.py``), in place of the per-turn trend.
* After sessions close and the cache is flushed, every pool is back where it
  started (``drain_rule``).
"""

from __future__ import annotations

from kvwatch.contracts import OWNERSHIP
from kvwatch.gate.verdicts.detectors.stats import first_rise
from kvwatch.gate.verdicts.detectors.story import finding_story, over_bound, probe_story, trajectory
from kvwatch.gate.verdicts.detectors.usage_trend import UsageTrend, usage_trend
from kvwatch.gate.verdicts.detectors.verdict import (
    Evidence,
    Verdict,
    fail,
    fail_after_drain,
    new_findings,
    not_back,
    passed,
    skipped,
    unjudged,
)
from kvwatch.harness.run_record import RunRecord, Signal

ID = "allocator"
NEEDS = frozenset({Signal.PROBES})


def detect(run: RunRecord) -> Verdict:
    for rule in (probe_rule, state_rule if run.soak is None else usage_rule, drain_rule):
        if (verdict := rule(run)) is not None:
            return verdict
    if why := unjudged(run):
        return skipped(ID, why)
    if run.soak is not None:
        return passed(ID, f"{len(run.turns)} probes within bounds, usage bounded, drained")
    return passed(ID, f"{len(run.turns)} turns within bounds, state flat, drained to baseline")


def probe_rule(run: RunRecord) -> Verdict | None:
    """Ownership findings and exceeded bounds, at the first probe that has them."""
    for turn in run.turns:
        for probe in turn.probes:
            hits = [f for f in new_findings(run, probe) if f.kind in OWNERSHIP]
            if hits:
                ev = [Evidence(group=f.group, pages=f.pages, detail=f.detail) for f in hits]
                story = finding_story(run, hits[0].kind, hits[0].group)
                return fail(ID, turn.turn, ev)._replace(story=story)
            over = [
                Evidence(
                    group=b.group,
                    pages=(),
                    detail=f"{b.pinned} pinned pages, live holders ({b.holders}) justify {b.limit}",
                )
                for b in probe.exceeded()
            ]
            if over:
                return fail(ID, turn.turn, over)._replace(story=_over_story(run, over[0].group))
    return None


def _over_story(run: RunRecord, group: str) -> str:
    return probe_story(f"{group} pinned pages over the bound", run, lambda p: over_bound(p, group))


def usage_trends(run: RunRecord) -> list[UsageTrend]:
    """A soak's pinned pages per group over the probes taken under load."""
    soak, loaded = run.soak, [t for t in run.turns if t.barrier is not None]
    if soak is None or not loaded:
        return []
    times = [t.at for t in loaded]
    out = []
    for group, g in loaded[0].barrier.groups.items():
        pinned = [
            t.barrier.bounds[group].pinned
            if group in t.barrier.bounds
            else t.barrier.groups[group].used
            for t in loaded
        ]
        out.append(
            usage_trend(
                group, g.capacity, times, pinned, soak.warmup_s, soak.users, soak.episode_ends
            )
        )
    return out


def usage_rule(run: RunRecord) -> Verdict | None:
    bad = [t for t in usage_trends(run) if not t.bounded]
    if not bad:
        return None
    return fail(
        ID, run.turns[-1].turn, [Evidence(group=t.group, pages=(), detail=t.why) for t in bad]
    )


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


def state_rule(run: RunRecord) -> Verdict | None:
    turns = [t.turn for t in run.turns]
    for group, series in interior_per_conversation(run).items():
        rise = first_rise(turns, series, run.warmup)
        if rise is not None:
            at, trend = rise
            detail = (
                f"interior snapshots per live conversation grow with turns "
                f"({series[0]:.1f} -> {series[-1]:.1f}): {trend.describe}"
            )
            points = list(zip(turns, series, strict=False))
            story = trajectory(f"{group} interior snapshots per conversation", points, None)
            return fail(ID, at, [Evidence(group=group, pages=(), detail=detail)])._replace(
                story=story
            )
    return None


def drain_rule(run: RunRecord) -> Verdict | None:
    """After sessions close and the cache is flushed, every pool uses no more pages
    than before the run, no page is owned wrongly (a finding names the last
    owners of what is left), no more requests or sessions are live, and every
    session the load opened is closed (its users open their sessions before
    the baseline, so the live count alone would not see one left open)."""
    if run.drained is None or run.baseline is None:
        return None
    base, after = run.baseline, run.drained
    left = [
        Evidence(
            group=group,
            pages=(),
            detail=f"{used:.0f} pages still used, {was:.0f} before the run; by owner "
            f"{ {k: v for k, v in after.groups[group].by_owner.items() if v} }",
        )
        for group, was, used in not_back(
            {g: v.used for g, v in base.groups.items()},
            {g: v.used for g, v in after.groups.items()},
        )
    ]
    # who last owned what is left: the drained probe's ownership findings name them
    left += [
        Evidence(group=f.group, pages=f.pages, detail=f"after the run: {f.detail}")
        for f in new_findings(run, after)
        if f.kind in OWNERSHIP
    ]
    live = ("live_requests", "live_sessions")
    left += [
        Evidence(
            group=None,
            pages=(),
            detail=f"{now:.0f} {name.replace('_', ' ')} left, {was:.0f} before",
        )
        for name, was, now in not_back(
            {k: getattr(base, k) for k in live}, {k: getattr(after, k) for k in live}
        )
    ]
    left += [
        Evidence(
            group=None,
            pages=(),
            detail=f"session {sid}, which the load opened, is still open after the drain "
            f"({len(run.sessions_left)} of {run.sessions_opened} the load opened)",
        )
        for sid in run.sessions_left
    ]
    if left:
        verdict = fail_after_drain(ID, run, left)
        if (group := left[0].group) is not None and group in base.groups:
            story = probe_story(f"{group} used pages", run, lambda p: p.groups[group].used)
            verdict = verdict._replace(story=f"{story} ({base.groups[group].used} before the run)")
        return verdict
    return None
