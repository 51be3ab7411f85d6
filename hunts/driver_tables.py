"""The tables of a hunt made of driver runs (``make vllm-hunt``; ``driver_runs.py`` makes the rows).

``OUT.json``: ``{"settings": ..., "runs": [row, ...]}``, a row per run with its
release, profile, layout, option, seed, resolved sizes, coverage counts
(``sched_coverage.py`` and the event ledger's totals), the rules its probes
showed (counted once per probe) with the first detail of each, why it was
not run (``unsupported``) or broke (``error``), and its wall time.

``OUT.md``: the settings; a coverage table, one line per release and
layout (runs, steps, requests, aborts, preemptions, prefix hits, hits inside
a block, the most partial-block entries at once, block copies, events
stored/removed/cleared, runs with findings); the findings, one line per
rule, release, layout and profile; the runs not made and the broken ones.
Everything below ``report.HAND_WRITTEN`` in an existing ``OUT.md`` (the
candidates' upstream search and verdicts) is kept as it is.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from hunts import report

COLUMNS = (
    ("steps", "steps"),
    ("requests", "requests"),
    ("aborts", "aborts"),
    ("preemptions", "preempt."),
    ("prefix hits", "hits"),
    ("mid-block hits", "mid-block hits"),
    ("partial entries (most)", "partial entries"),
    ("block copies", "CoW copies"),
)


def coverage_rows(rows: list[dict]) -> list[str]:
    """One table line per (release, layout) the runs covered."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        if not row["unsupported"] and not row["error"]:
            groups[(row["release"], row["layout"])].append(row)
    head = ["release", "layout", "runs", *(title for _, title in COLUMNS)]
    head += ["events stored/removed/cleared", "runs with findings"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (release, layout), runs in sorted(groups.items()):
        total: Counter = Counter()
        most = 0
        events: Counter = Counter()
        for run in runs:
            cov = run["coverage"]
            total.update({k: v for k, v in cov.items() if isinstance(v, int)})
            most = max(most, cov.get("partial entries (most)", 0))
            events.update(cov.get("events") or {})
        total["partial entries (most)"] = most
        cells = [release, f"`{layout}`", str(len(runs))]
        cells += [str(total[key]) for key, _ in COLUMNS]
        cells.append(
            f"{events['keys stored']}/{events['keys removed']}/{events['AllBlocksCleared']}"
        )
        cells.append(str(sum(bool(r["rules"]) for r in runs)))
        out.append("| " + " | ".join(cells) + " |")
    return out


def finding_rows(rows: list[dict]) -> list[str]:
    """One line per (rule, release, layout, profile) with findings, and its first detail."""
    hits: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        for rule in row["rules"]:
            hits[(rule, row["release"], row["layout"], row["profile"])].append(row)
    if not hits:
        return ["No check found anything in any run."]
    out = [
        "| rule | release | layout | profile | runs | probes | first |",
        "|---|---|---|---|---|---|---|",
    ]
    for (rule, release, layout, profile), runs in sorted(hits.items()):
        probes = sum(r["rules"][rule] for r in runs)
        first = runs[0]["first"][rule].replace("|", "/")
        out.append(
            f"| `{rule}` | {release} | `{layout}` | {profile} | {len(runs)} | {probes} | {first} |"
        )
    return out


TITLE = "vLLM scheduler hunt"
INTRO = (
    "Written by `make vllm-hunt` (`python -m hunts.vllm`): vLLM's own",
    "`Scheduler` in process with a model runner's output faked, every check after every",
    "step (`--engine vllm-scheduler` in `src/kvwatch/targets/vllm/README.md`).",
)


def not_run_lines(rows: list[dict]) -> list[str]:
    """The runs not made (the release cannot build the layout) and the broken ones."""
    out = []
    for row in rows:
        why = row["unsupported"] or row["error"]
        if why:
            kind = "not run" if row["unsupported"] else "BROKEN"
            out.append(
                f"- {kind}: {row['release']} {row['profile']} `{row['layout']}`: {why[:300]}"
            )
    return out or ["Every run ran to its end."]


def markdown(rows: list[dict], settings: dict) -> str:
    """The hunt's markdown above the hand-written marker."""
    runs = [r for r in rows if not r["unsupported"]]
    line = (
        f"Settings: releases {', '.join(settings['releases'])}; {settings['seeds']} seeds of "
        f"`mixed` ({settings['steps']} steps of arrivals a turn); {settings['turns']} turns at "
        f"c = {settings['c']}; {settings['jobs']} workers on {settings['cores']} cores; "
        f"{len(rows)} runs ({len(rows) - len(runs)} not possible on their release) in "
        f"{settings['wall_s']} s."
    )
    sections = [
        ("Coverage", coverage_rows(rows)),
        ("Findings", finding_rows(rows)),
        ("Not run, broken", not_run_lines(rows)),
    ]
    return report.document(TITLE, INTRO, line, sections)
