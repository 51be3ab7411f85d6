"""The report's text: the verdict, each failure's evidence, the runs, coverage.

Everything summary.json says about a verdict is written out on the page,
never kept for a tooltip: a CI artifact's preview and a printout show the
whole evidence. Turn numbers are summary.json's, as they are there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from html import escape
from pathlib import Path

from kvwatch.telemetry.coverage import coverage

KNOWN = ("verdict", "first_turn", "after_drain", "evidence", "details")
KNOWN_DETAIL = ("group", "pages", "detail", "traceback")
SHOWN_PAGES = 12


def run_name(run: Mapping) -> str:
    return f"{run['profile']} c={run['concurrency']}"


def where(d: Mapping) -> str:
    """When a detector first failed, as summary.json has it."""
    return "after the drain" if d.get("after_drain") else f"at turn {d.get('first_turn')}"


def failures(summary: Mapping) -> list[tuple[Mapping, str, Mapping]]:
    """(run, detector, entry) for every failed detector of every run, in run order."""
    return [
        (run, name, d)
        for run in summary["runs"]
        for name, d in run["detectors"].items()
        if d["verdict"] == "fail"
    ]


def head(summary: Mapping) -> str:
    """The verdict first, in words a printout keeps."""
    verdict, runs = summary["verdict"], summary["runs"]
    faults = ", ".join(summary["faults"]) or "none"
    failed = [n for n, v in summary["detectors"].items() if v == "fail"]
    skipped = sorted(
        {n for r in runs for n, d in r["detectors"].items() if d["verdict"] == "skipped"}
    )
    broke = [r for r in runs if r.get("error")]
    if failed:
        said = (
            f"{len(failed)} of {len(summary['detectors'])} detectors failed: {', '.join(failed)}."
        )
    elif broke:
        said = f"No detector failed, but {len(broke)} of {len(runs)} runs broke."
    else:
        said = "Every detector passed in " + (
            f"all {len(runs)} runs" if len(runs) > 1 else "the run"
        )
        said += f" (skipped where it had no data: {', '.join(skipped)})." if skipped else "."
    return (
        f"<h1 class='verdict {escape(verdict)}'>kvwatch gate: {escape(verdict.upper())}</h1>"
        f"<p class='said'>{escape(said)}</p>"
        f"<p>faults injected: {escape(faults)}; elapsed {summary.get('elapsed_s', '?')} s; "
        "turns are numbered as in summary.json.</p>"
    )


def evidence(summary: Mapping) -> str:
    """Each failed detector of each run with all it carries, and each broken run."""
    parts = []
    for run, name, d in failures(summary):
        parts.append(
            f"<div class='failure'><h3>{escape(run_name(run))}: {escape(name)} failed {escape(where(d))}</h3>"
            f"<p class='evidence'>{escape(d['evidence'])}</p>"
        )
        details = d.get("details") or []
        if details:
            parts.append("<ol class='details'>" + "".join(_detail(e) for e in details) + "</ol>")
        extra = {k: v for k, v in d.items() if k not in KNOWN}
        parts += [f"<p>{escape(k)}: {escape(_plain(v))}</p>" for k, v in extra.items()]
        parts.append("</div>")
    for run in summary["runs"]:
        if run.get("error"):
            parts.append(
                f"<div class='failure'><h3>{escape(run_name(run))}: the run broke</h3><p class='evidence'>{escape(run['error'])}</p></div>"
            )
    if not parts:
        return ""
    return "<h2>What failed</h2>" + "".join(parts)


def _detail(e: Mapping) -> str:
    bits = []
    if e.get("group"):
        bits.append(f"group {e['group']}")
    pages = list(e.get("pages") or [])
    if pages:
        shown = ", ".join(map(str, pages[:SHOWN_PAGES]))
        more = f" and {len(pages) - SHOWN_PAGES} more ids" if len(pages) > SHOWN_PAGES else ""
        bits.append(f"pages {shown}{more}")
    extra = [f"{k}: {_plain(v)}" for k, v in e.items() if k not in KNOWN_DETAIL]
    line = " · ".join([*bits, *extra])
    text = f"<li>{escape(line + ' · ' if line else '')}<span class='detail'>{escape(str(e.get('detail', '')))}</span>"
    if e.get("traceback"):
        text += "<pre>" + escape("\n".join(e["traceback"])) + "</pre>"
    return text + "</li>"


def _plain(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def runs_table(summary: Mapping, out: Path) -> str:
    """Per run: requests, failed ones, lifecycle coverage, its Locust report, its verdict."""
    rows = [
        "<h2>Runs</h2><table><tr><th>run</th><th>turns</th><th>requests</th><th>failed</th>"
        "<th>lifecycle transitions taken</th><th>Locust report</th><th>detectors</th></tr>"
    ]
    for run in summary["runs"]:
        folder = f"runs/{run['profile']}-c{run['concurrency']}"
        link = (
            f"<a href='{escape(folder)}/locust.html'>{escape(folder)}/locust.html</a>"
            if (out / folder / "locust.html").exists()
            else "none written"
        )
        failed = [
            f"{n} ({where(d)})" for n, d in run["detectors"].items() if d["verdict"] == "fail"
        ]
        skipped = [n for n, d in run["detectors"].items() if d["verdict"] == "skipped"]
        said = "FAIL: " + ", ".join(failed) if failed else "all passed"
        if run.get("error"):
            said = f"broke: {run['error']}" + (f"; {said}" if failed else "")
        if skipped:
            said += f" (skipped: {', '.join(skipped)})"
        cells = [run_name(run), run["turns"], run["requests"], run["errors"], _run_coverage(run)]
        rows.append(
            "<tr>"
            + "".join(f"<td>{escape(str(v))}</td>" for v in cells)
            + f"<td>{link}</td><td class='{'fail' if failed or run.get('error') else 'pass'}'>{escape(said)}</td></tr>"
        )
    return "".join(rows) + "</table>"


def _run_coverage(run: Mapping) -> str:
    taken = run.get("coverage")
    if not taken:
        return "not recorded"
    return ", ".join(f"{m} {len(c['taken'])} of {c['total']}" for m, c in coverage(taken).items())


def coverage_section(summary: Mapping) -> str:
    """Lifecycle transitions taken, per profile and machine, and the ones never taken."""
    cov = summary.get("coverage")
    if not cov:
        return ""
    machines = list(cov["total"])
    rows = ["<h2>Lifecycle coverage</h2><table><tr><th>profile</th>"]
    rows += [f"<th>{escape(m)}</th>" for m in machines] + ["</tr>"]
    for name, per in [*cov["profiles"].items(), ("all runs", cov["total"])]:
        cells = "".join(f"<td>{len(per[m]['taken'])} of {per[m]['total']}</td>" for m in machines)
        rows.append(f"<tr><td>{escape(name)}</td>{cells}</tr>")
    rows.append("</table>")
    never = [f"{m}: {t}" for m in machines for t in cov["total"][m]["never"]]
    unlisted = [f"{m}: {t}" for m in machines for t in cov["total"][m]["unlisted"]]
    rows.append(
        "<p>Never taken: " + escape(", ".join(never)) + "</p>"
        if never
        else "<p>Every transition was taken at least once.</p>"
    )
    if unlisted:
        rows.append("<p>Seen but not in the machines: " + escape(", ".join(unlisted)) + "</p>")
    return "".join(rows)


def all_verdicts(summary: Mapping) -> str:
    """Every detector of every run with its evidence: passes and skips say why too."""
    rows = [
        "<h2>Every verdict</h2><table class='small'><tr><th>run</th><th>detector</th><th>verdict</th><th>evidence</th></tr>"
    ]
    for run in summary["runs"]:
        for name, d in run["detectors"].items():
            verdict = d["verdict"] + (f" {where(d)}" if d["verdict"] == "fail" else "")
            cells = "".join(f"<td>{escape(str(v))}</td>" for v in (run_name(run), name))
            rows.append(
                f"<tr>{cells}<td class='{escape(d['verdict'])}'>{escape(verdict)}</td><td>{escape(d['evidence'])}</td></tr>"
            )
    return "".join(rows) + "</table>"
