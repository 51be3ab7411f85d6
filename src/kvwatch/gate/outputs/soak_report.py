"""What a soak prints and writes besides the verdict: its figures, series and table.

``summary.json["soak"]`` keeps the soak's figures (requests, probes, pinned
and used pages per group, the usage trend per group) and ``checks``, the
four questions a soak answers, each answered by the detectors' own rules::

    no-5xx              the ``requests`` detector
    probe-findings      allocator's probe rule, then refcount, tree, slot-table
    usage-bounded       allocator's usage rule (``verdicts/detectors/usage_trend.py``)
    drain-to-baseline   allocator's drain rule

``OUT/soak/usage.csv`` has a row per probe, ``OUT/soak/episodes.csv`` one per
episode a user ended.
"""

from __future__ import annotations

import csv
from pathlib import Path

from kvwatch.gate.verdicts.detectors import allocator
from kvwatch.gate.verdicts.detectors.verdict import PASS, Verdict
from kvwatch.gate.verdicts.judge import RunResult
from kvwatch.harness.run_record import Counts, RunRecord

FINDING_DETECTORS = ("refcount", "tree", "slot-table")


def _check(verdict: Verdict | None, passing: str) -> dict:
    if verdict is None:
        return {"verdict": PASS, "evidence": passing}
    return {"verdict": verdict.verdict, "evidence": verdict.summary()}


def checks(record: RunRecord, result: RunResult) -> dict[str, dict]:
    """The soak's four checks, each the verdict of the detector rule that answers it."""
    if record.baseline is None or not result.verdicts:
        return {}
    found = allocator.probe_rule(record) or next(
        (result.verdicts[d] for d in FINDING_DETECTORS if result.verdicts[d].failed), None
    )
    drain = allocator.drain_rule(record)
    if record.drained is None:
        drain = Verdict(
            detector=allocator.ID,
            verdict="fail",
            first_turn=None,
            evidence=(),
            note="no probe after the drain",
        )
    return {
        "no-5xx": _check(result.verdicts.get("requests"), ""),
        "probe-findings": _check(found, f"{len(record.turns) + 1} probes, no findings"),
        "usage-bounded": _check(allocator.usage_rule(record), "every group bounded"),
        "drain-to-baseline": _check(drain, "every pool back at its baseline, nothing live"),
    }


def soak_section(opts, record: RunRecord, result: RunResult, wall: float) -> dict:
    sent = record.requests or Counts(status={}, failed=0, broken_turns=0)
    probes = [t.barrier for t in record.turns if t.barrier is not None]
    usage = {}
    for t in allocator.usage_trends(record):
        used = [p.groups[t.group].used for p in probes]
        usage[t.group] = {
            **t.as_dict(),
            "used_min": min(used, default=0),
            "used_max": max(used, default=0),
            "baseline_used": record.baseline.groups[t.group].used,
            "drained_used": record.drained.groups[t.group].used if record.drained else None,
        }
    soak = record.soak
    return {
        "verdict": "error" if record.error else _overall(result),
        "error": record.error,
        "profiles": list(opts.profiles),
        "concurrency": opts.concurrency,
        "duration_s": opts.duration,
        "load_s": soak.load_s if soak else 0.0,
        "wall_s": wall,
        "probe_every_s": opts.interval,
        "requests": sent.requests,
        "errors": sent.errors,
        "http_5xx": sent.status.get("5xx", 0),
        "http_status": sent.status,
        "probes": len(probes),
        "busy_probes": sum(p.live_requests > 0 for p in probes),
        "probe_errors": soak.probe_errors if soak else 0,
        "episodes": len(soak.episode_ends) if soak else 0,
        "findings": sum(len(p.findings) + len(p.exceeded()) for p in probes)
        + (len(record.drained.findings) if record.drained else 0),
        "checks": checks(record, result),
        "usage": usage,
        "series": "soak/usage.csv",
    }


def _overall(result: RunResult) -> str:
    return "fail" if any(v.failed for v in result.verdicts.values()) else PASS


def write_series(path: Path, record: RunRecord) -> None:
    """One row per probe: time, live work, findings, and per group used, pinned, by owner."""
    turns = [t for t in record.turns if t.barrier is not None]
    if not turns:
        return
    first = turns[0].barrier
    owners = {g: list(v.by_owner) for g, v in first.groups.items()}
    head = ["t_s", "live_requests", "live_sessions", "findings"]
    for g in owners:
        head += [f"{g}.used", f"{g}.pinned", *(f"{g}.{o}" for o in owners[g])]
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(head)
        for t in turns:
            p = t.barrier
            row = [t.at, p.live_requests, p.live_sessions, len(p.findings) + len(p.exceeded())]
            for g in owners:
                pinned = p.bounds[g].pinned if g in p.bounds else p.groups[g].used
                row += [
                    p.groups[g].used,
                    pinned,
                    *(p.groups[g].by_owner.get(o, 0) for o in owners[g]),
                ]
            out.writerow(row)


def write_episodes(path: Path, record: RunRecord) -> None:
    """One row per episode a user ended: the user and the time, in seconds of the soak."""
    ends = record.soak.episode_ends if record.soak else ()
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["user", "t_s"])
        out.writerows((user, t) for user, t in sorted(ends, key=lambda e: e[1]))


def table(soak: dict) -> str:
    """The soak's figures as a short text table."""
    lines = [
        f"soak: {soak['verdict']}  {soak['duration_s']:.0f} s of load at c={soak['concurrency']} "
        f"({', '.join(soak['profiles'])}), {soak['wall_s']} s wall",
        f"requests {soak['requests']}, errors {soak['errors']}, 5xx {soak['http_5xx']}; "
        f"probes {soak['probes']} ({soak['busy_probes']} busy), findings {soak['findings']}",
    ]
    if soak["usage"]:
        lines.append(
            f"{'group':<13}{'capacity':>9}{'pinned':>11}{'used':>11}{'slope/min':>11}"
            f"{'p':>8}{'baseline':>9}{'drained':>8}"
        )
        for g, u in soak["usage"].items():
            lines.append(
                f"{g:<13}{u['capacity']:>9}{u['pinned_min']:>5}..{u['pinned_max']:<4}"
                f"{u['used_min']:>5}..{u['used_max']:<4}{u['slope_per_min']:>+11.2f}"
                f"{u['p_value']:>8.3f}{u['baseline_used']:>9}{u['drained_used']!s:>8}"
            )
    lines += [f"{name:<18} {c['verdict']:<5} {c['evidence']}" for name, c in soak["checks"].items()]
    if soak["error"]:
        lines.append(f"error: {soak['error']}")
    return "\n".join(lines)
