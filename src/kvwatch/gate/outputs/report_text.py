"""The report's text: the verdict, each failure's evidence, the runs, coverage.

Everything the summary says about a verdict is written out on the page,
never kept for a tooltip: a CI artifact's preview and a printout show the
whole evidence. Turn numbers are summary.json's, as they are there.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from kvwatch.gate.outputs.summary import GateSummary
from kvwatch.gate.verdicts.detectors import ERROR, FAIL, SKIPPED, Evidence, Verdict
from kvwatch.gate.verdicts.judge import RunResult
from kvwatch.instrumentation.coverage import coverage

SHOWN_PAGES = 12


def where(v: Verdict) -> str:
    """When a detector first failed, as summary.json has it."""
    if v.errored:
        return "while judging"
    return "after the drain" if v.after_drain else f"at turn {v.first_turn}"


def head(summary: GateSummary) -> str:
    """The verdict first, in words a printout keeps."""
    verdict, runs = summary.verdict, summary.runs
    faults = ", ".join(summary.faults) or "none"
    failed = [n for n, v in summary.detectors.items() if v == FAIL]
    crashed = [n for n, v in summary.detectors.items() if v == ERROR]
    skipped = sorted({n for r in runs for n, v in r.verdicts.items() if v.verdict == SKIPPED})
    broke = [r for r in runs if r.error]
    if failed:
        said = f"{len(failed)} of {len(summary.detectors)} detectors failed: {', '.join(failed)}."
    elif crashed:
        said = f"No detector failed, but {', '.join(crashed)} raised while judging."
    elif broke:
        said = f"No detector failed, but {len(broke)} of {len(runs)} runs broke."
    else:
        said = "Every detector passed in " + (
            f"all {len(runs)} runs" if len(runs) > 1 else "the run"
        )
        said += f" (skipped where it had no data: {', '.join(skipped)})." if skipped else "."
    elapsed = summary.elapsed_s if summary.elapsed_s is not None else "?"
    return (
        f"<h1 class='verdict {escape(verdict)}'>kvwatch gate: {escape(verdict.upper())}</h1>"
        f"<p class='said'>{escape(said)}</p>"
        f"<p>target: {escape(summary.target or '?')}; faults injected: {escape(faults)}; "
        f"elapsed {elapsed} s; turns are numbered as in summary.json.</p>"
    )


def evidence(summary: GateSummary) -> str:
    """Each failed (or crashed) detector of each run with all it carries, and each broken run."""
    parts = []
    for run, name in summary.failures():
        v = run.verdicts[name]
        how = "failed" if v.failed else "raised"
        parts.append(
            f"<div class='failure'><h3>{escape(run.name)}: {escape(name)} {how} {escape(where(v))}</h3>"
            + (f"<p class='story'>{escape(v.story)}</p>" if v.story else "")
            + f"<p class='evidence'>{escape(v.summary())}</p>"
        )
        if v.evidence:
            parts.append("<ol class='details'>" + "".join(_detail(e) for e in v.evidence) + "</ol>")
        parts.append("</div>")
    for run in summary.runs:
        if run.error:
            parts.append(
                f"<div class='failure'><h3>{escape(run.name)}: the run broke</h3><p class='evidence'>{escape(run.error)}</p></div>"
            )
    if not parts:
        return ""
    return "<h2>What failed</h2>" + "".join(parts)


def notices(summary: GateSummary) -> str:
    """Each run's notices: broken invariants its engine holds harmless. No detector fails
    on them; ``--strict`` fails the gate on any."""
    rows = [
        f"<li>{escape(run.name)}, turn {t}: <b>{escape(f.kind)}</b> {escape(f.group or '')}: "
        f"<span class='detail'>{escape(f.detail)}</span></li>"
        for run in summary.runs
        for t, f in run.notices
    ]
    if not rows:
        return ""
    how = (
        "With --strict they fail this gate."
        if summary.strict
        else "No detector fails on them: the user decides (--strict fails the gate on any)."
    )
    return (
        "<h2>Notices</h2><p class='note'>Invariants the engine broke and holds harmless. "
        f"{how}</p><ul>{''.join(rows)}</ul>"
    )


def _detail(e: Evidence) -> str:
    bits = []
    if e.group:
        bits.append(f"group {e.group}")
    if e.pages:
        shown = ", ".join(map(str, e.pages[:SHOWN_PAGES]))
        more = f" and {len(e.pages) - SHOWN_PAGES} more ids" if len(e.pages) > SHOWN_PAGES else ""
        bits.append(f"pages {shown}{more}")
    line = " · ".join(bits)
    text = (
        f"<li>{escape(line + ' · ' if line else '')}<span class='detail'>{escape(e.detail)}</span>"
    )
    if e.traceback:
        text += "<pre>" + escape("\n".join(e.traceback)) + "</pre>"
    return text + "</li>"


def runs_table(summary: GateSummary, out: Path) -> str:
    """Per run: requests, failed ones, lifecycle coverage, its Locust report, its verdict.

    The Locust reports are files of the gate's output folder, linked from here by
    their place in it: a note says so, for a report.html copied without them."""
    rows = [
        "<p class='note'>This page is one file, but the Locust report of each run is not: it "
        "lies in the gate's output folder, under runs/, where the links below point. Keep "
        "report.html in that folder (or upload the folder) to follow them.</p>",
        "<h2>Runs</h2><table><tr><th>run</th><th>turns</th><th>requests</th><th>failed</th>"
        "<th>transitions taken per machine</th><th>Locust report</th><th>detectors</th></tr>",
    ]
    for run in summary.runs:
        folder = f"runs/{run.profile}-c{run.concurrency}"
        link = (
            f"<a href='{escape(folder)}/locust.html'>{escape(folder)}/locust.html</a>"
            if (out / folder / "locust.html").exists()
            else "none written"
        )
        failed = [f"{n} ({where(v)})" for n, v in {**run.failed(), **run.errored()}.items()]
        skipped = [n for n, v in run.verdicts.items() if v.verdict == SKIPPED]
        said = "FAIL: " + ", ".join(failed) if failed else "all passed"
        if run.error:
            said = f"broke: {run.error}" + (f"; {said}" if failed else "")
        if skipped:
            said += f" (skipped: {', '.join(skipped)})"
        cells = [run.name, run.turns, run.requests, run.errors, _run_coverage(run)]
        rows.append(
            "<tr>"
            + "".join(f"<td>{escape(str(v))}</td>" for v in cells)
            + f"<td>{link}</td><td class='{'fail' if failed or run.error else 'pass'}'>{escape(said)}</td></tr>"
        )
    return "".join(rows) + "</table>"


def performance_table(summary: GateSummary) -> str:
    """Per run, the numbers a load test reports: latency percentiles, rates, hit rate."""
    rows = [
        (run.name, p) for run in summary.runs if (p := run.performance) is not None and p.requests
    ]
    if not rows:
        return ""
    head = (
        "<h2>Performance</h2><table><tr><th>run</th><th>answered</th>"
        "<th>TTFT p50/p90/p99</th><th>ITL p50/p90/p99</th><th>end to end p50/p90/p99</th>"
        "<th>requests/s</th><th>output tokens/s</th><th>prefix cache hit</th></tr>"
    )
    body = []
    for name, p in rows:
        cells = [
            name,
            p.requests,
            p.ttft.text("ms") if p.ttft else "-",
            p.itl.text("ms") if p.itl else "-",
            p.e2e.text("s") if p.e2e else "-",
            f"{p.requests_per_s:.1f}" if p.requests_per_s is not None else "-",
            f"{p.output_tokens_per_s:.0f}" if p.output_tokens_per_s is not None else "-",
            f"{p.prefix_hit_rate:.0%}" if p.prefix_hit_rate is not None else "-",
        ]
        body.append("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in cells) + "</tr>")
    return head + "".join(body) + "</table>"


def time_table(summary: GateSummary) -> str:
    """Per run, where its wall time went and what the engine thread spent its CPU on
    (summary.json's ``runs[].time``)."""
    rows = [(run.name, t) for run in summary.runs if (t := run.spent) is not None]
    if not rows:
        return ""
    head = (
        "<h2>Where the time went</h2><table><tr><th>run</th><th>run, s</th>"
        "<th>server start</th><th>Locust start</th><th>warm-up turns</th><th>judged turns</th>"
        "<th>drain</th><th>replay</th><th>engine CPU: steps / watch / calls, s</th></tr>"
    )
    body = []
    for name, t in rows:
        phases = (t.server_start_s, t.load_start_s, t.warmup_s, t.turns_s, t.drain_s, t.replay_s)
        engine = f"{t.step_s:.1f} / {t.watch_s:.1f} / {t.calls_s:.1f} ({t.steps} steps)"
        cells = [name, f"{t.run_s:.1f}", *(f"{v:.1f}" for v in phases), engine]
        body.append("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in cells) + "</tr>")
    return head + "".join(body) + "</table>"


def _run_coverage(run: RunResult) -> str:
    if not run.coverage:
        return "not recorded"
    taken = coverage(run.coverage)
    return ", ".join(f"{m} {len(c['taken'])} of {c['total']}" for m, c in taken.items())


def coverage_section(summary: GateSummary) -> str:
    """Transitions taken, per profile and machine (the lifecycles, then the
    combination and boundary machines), and the ones never taken."""
    cov = summary.coverage
    if not cov:
        return ""
    machines = list(cov["total"])
    rows = ["<h2>Coverage</h2><table><tr><th>profile</th>"]
    rows += [f"<th>{escape(m)}</th>" for m in machines] + ["</tr>"]
    for name, per in [*cov["profiles"].items(), ("all runs", cov["total"])]:
        cells = "".join(f"<td>{len(per[m]['taken'])} of {per[m]['total']}</td>" for m in machines)
        rows.append(f"<tr><td>{escape(name)}</td>{cells}</tr>")
    rows.append("</table>")
    never = [f"{m}: {t}" for m in machines for t in cov["total"][m]["never"]]
    unlisted = [f"{m}: {t}" for m in machines for t in cov["total"][m]["unlisted"]]
    rows.append(
        "<p class='small'>Never taken: " + escape(", ".join(never)) + "</p>"
        if never
        else "<p>Every transition was taken at least once.</p>"
    )
    if unlisted:
        rows.append(
            "<p class='small'>Seen but not in the machines: " + escape(", ".join(unlisted)) + "</p>"
        )
    return "".join(rows)


def all_verdicts(summary: GateSummary) -> str:
    """Every detector of every run with its evidence: passes and skips say why too."""
    rows = [
        "<h2>Every verdict</h2><table class='small'><tr><th>run</th><th>detector</th><th>verdict</th><th>evidence</th></tr>"
    ]
    for run in summary.runs:
        for name, v in run.verdicts.items():
            verdict = v.verdict + (f" {where(v)}" if v.verdict in (FAIL, ERROR) else "")
            cells = "".join(f"<td>{escape(str(x))}</td>" for x in (run.name, name))
            rows.append(
                f"<tr>{cells}<td class='{escape(v.verdict)}'>{escape(verdict)}</td><td>{escape(v.summary())}</td></tr>"
            )
    return "".join(rows) + "</table>"
