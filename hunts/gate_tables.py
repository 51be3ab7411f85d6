"""The tables of a hunt made of gates (``gates.py`` makes the rows; ``report.py`` writes both files).

Sections: the settings; coverage, one line per (release, layout) with its
runs, passes, failures, errors, runs not possible there and what decided
them; the findings, one line per (detector, known row or candidate,
layout, profile) with the releases and seeds it came from and its first
evidence; the reasons runs were not possible (counted, not findings) and
the broken runs.

Invariant: an ``unsupported`` row is never counted as a run nor as a
finding; a finding is labelled ``known: ID`` only when the corpus explains
it, else ``candidate`` (its upstream search is written by hand below the
marker).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

from hunts import report
from hunts.report import cell


def coverage_lines(rows: Sequence[dict], order: Sequence[str]) -> list[str]:
    """One line per (release, layout): runs, pass / fail / error, unsupported, decided by."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        groups[(row["release"], row["layout"])].append(row)
    head = ["release", "layout", "runs", "pass", "fail", "error", "not possible", "decided by"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rank = {r: i for i, r in enumerate(order)}
    for (release, layout), mine in sorted(groups.items(), key=lambda g: (rank.get(g[0][0]), g[0])):
        verdicts = Counter(r["verdict"] for r in mine)
        ran = len(mine) - verdicts["unsupported"]
        who = sorted(
            {r["decided_by"] for r in mine if r["decided_by"] and r["verdict"] != "unsupported"}
        )
        cells = [release, f"`{layout}`", str(ran), str(verdicts["pass"]), str(verdicts["fail"])]
        cells += [str(verdicts["error"]), str(verdicts["unsupported"]), ", ".join(who) or "-"]
        out.append("| " + " | ".join(cells) + " |")
    return out


def finding_lines(rows: Sequence[dict], order: Sequence[str]) -> list[str]:
    """One line per (detector, label, layout, profile): where it came from and its first evidence."""
    hits: dict[tuple, list[tuple[dict, dict]]] = defaultdict(list)
    for row in rows:
        for f in row["findings"]:
            label = f"known: `{f['known']}`" if f["known"] else "**candidate**"
            label += " (after its stall or leak)" if f.get("after_known") else ""
            hits[(f["detector"], label, row["layout"], row["profile"])].append((row, f))
    if not hits:
        return ["No detector failed in any run."]
    rank = {r: i for i, r in enumerate(order)}
    out = [
        "| detector | label | layout | profile | releases | runs | seeds | c | first evidence |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (detector, label, layout, profile), found in sorted(hits.items()):
        releases = sorted({r["release"] for r, _ in found}, key=lambda v: rank.get(v, 0))
        seeds = sorted({r["seed"] for r, _ in found})
        cs = sorted({r["c"] for r, _ in found})
        cells = [f"`{detector}`", label, f"`{layout}`", profile, ", ".join(releases)]
        cells += [str(len(found)), ",".join(map(str, seeds)), ",".join(map(str, cs))]
        cells.append(cell(found[0][1]["evidence"]))
        out.append("| " + " | ".join(cells) + " |")
    return out


def not_run_lines(rows: Sequence[dict]) -> list[str]:
    """Why runs were not possible (counted per reason), then every broken run."""
    why = Counter(r["unsupported"] for r in rows if r["unsupported"])
    out = [f"- not possible ({n} runs): {cell(reason)[:300]}" for reason, n in sorted(why.items())]
    for r in rows:
        if r["error"]:
            where = f"{r['release']} `{r['layout']}` {r['profile']} seed {r['seed']} c={r['c']}"
            out.append(f"- BROKEN: {where}: {cell(r['error'])[:300]}")
    return out or ["Every run ran to its end."]


def markdown(rows: Sequence[dict], settings: dict, *, title: str, intro: Sequence[str]) -> str:
    """The hunt's markdown above the hand-written marker."""
    order = list(dict.fromkeys(r["release"] for r in rows))
    runs = [r for r in rows if r["verdict"] != "unsupported"]
    found = [f for r in rows for f in r["findings"]]
    candidates = sum(not f["known"] for f in found)
    line = (
        f"Settings: {settings['matrix']}; {settings['jobs']} gates at a time on "
        f"{settings['cores']} cores; {len(runs)} runs ({len(rows) - len(runs)} more not "
        f"possible on their build) in {settings['wall_s']} s. "
        f"{len(found)} findings: {len(found) - candidates} known, {candidates} candidates."
    )
    sections = [
        ("Coverage", coverage_lines(rows, order)),
        ("Findings", finding_lines(rows, order)),
        ("Not possible, broken", not_run_lines(rows)),
    ]
    return report.document(title, intro, line, sections)
