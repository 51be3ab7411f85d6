"""``OUT/report.html``: one self-contained page (plots inlined as PNG data URIs).

summary.json ─┐
runs/*/record.json ──► per profile: pool usage by owner per turn and c,
runs/*/locust_stats.csv    latency percentiles per c; heap bytes per context
                           token per turn; the detector table with evidence
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from kvwatch.instrumentation.detectors import RunRecord

OWNERS = ("tree", "request", "session", "slot", "host")
COLORS = {"pass": "#d8f0d8", "fail": "#f6c9c9", "skipped": "#eeeeee"}
PERCENTILES = ("50%", "90%", "99%")


def write_report(summary: dict, out: Path) -> Path:
    runs = summary["runs"]
    loaded = {
        (r["profile"], r["concurrency"]): _load(out, r["profile"], r["concurrency"]) for r in runs
    }
    profiles = list(dict.fromkeys(r["profile"] for r in runs))
    parts = [_head(summary), _table(summary), _coverage(summary)]
    for profile in profiles:
        records = {c: rec for (p, c), rec in loaded.items() if p == profile}
        parts.append(f"<h2>{html.escape(profile)}</h2>")
        if any(rec and rec.turns and rec.turns[0].probes for rec in records.values()):
            parts.append(_img(_usage_figure(profile, records), "pool usage by owner per turn"))
        elif any(rec and rec.turns for rec in records.values()):
            parts.append(_img(_gauge_figure(profile, records), "gauges per turn"))
        latency = {c: _latency(out, profile, c) for c in records}
        if any(latency.values()):
            parts.append(_img(_latency_figure(profile, latency), "latency percentiles"))
    heap = _heap_series(loaded)
    if heap:
        parts.append("<h2>heap</h2>" + _img(_heap_figure(heap), "heap bytes per context token"))
    page = "\n".join(
        [
            "<!doctype html><html><head><meta charset='utf-8'><title>kvwatch gate</title>",
            "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
            "td,th{border:1px solid #bbb;padding:3px 8px;font-size:13px}img{max-width:100%}"
            "</style></head><body>",
            *parts,
            "</body></html>",
        ]
    )
    path = out / "report.html"
    path.write_text(page)
    return path


def _load(out: Path, profile: str, c: int) -> RunRecord | None:
    path = out / "runs" / f"{profile}-c{c}" / "record.json"
    return RunRecord.from_json(json.loads(path.read_text())) if path.exists() else None


def _head(summary: dict) -> str:
    faults = ", ".join(summary["faults"]) or "none"
    return (
        f"<h1>kvwatch gate: {html.escape(summary['verdict'])}</h1>"
        f"<p>faults injected: {html.escape(faults)}; "
        f"elapsed {summary.get('elapsed_s', '?')} s</p>"
    )


def _table(summary: dict) -> str:
    names = list(summary["detectors"])
    rows = ["<table><tr><th>profile</th><th>c</th><th>requests</th><th>failed</th>"]
    rows += [f"<th>{html.escape(n)}</th>" for n in names] + ["</tr>"]
    for run in summary["runs"]:
        cells = [run["profile"], run["concurrency"], run["requests"], run["errors"]]
        row = "".join(f"<td>{html.escape(str(v))}</td>" for v in cells)
        for name in names:
            d = run["detectors"].get(name)
            if d is None:
                row += "<td></td>"
                continue
            mark = d["verdict"] + (f" (turn {d['first_turn']})" if d["verdict"] == "fail" else "")
            row += (
                f"<td style='background:{COLORS[d['verdict']]}' "
                f"title='{html.escape(d['evidence'], quote=True)}'>{mark}</td>"
            )
        if run.get("error"):
            row += f"<td style='background:#f6c9c9'>{html.escape(run['error'])}</td>"
        rows.append(f"<tr>{row}</tr>")
    rows.append("</table><p>Hover a cell for its evidence; summary.json has all of it.</p>")
    return "".join(rows)


def _coverage(summary: dict) -> str:
    """Lifecycle transitions taken, per profile and machine, and the ones never taken."""
    cov = summary.get("coverage")
    if not cov:
        return ""
    machines = list(cov["total"])
    rows = ["<h2>lifecycle coverage</h2><table><tr><th>profile</th>"]
    rows += [f"<th>{html.escape(m)}</th>" for m in machines] + ["</tr>"]
    for name, per in [*cov["profiles"].items(), ("all runs", cov["total"])]:
        cells = "".join(f"<td>{len(per[m]['taken'])} of {per[m]['total']}</td>" for m in machines)
        rows.append(f"<tr><td>{html.escape(name)}</td>{cells}</tr>")
    rows.append("</table>")
    never = [f"{m}: {t}" for m in machines for t in cov["total"][m]["never"]]
    unlisted = [f"{m}: {t}" for m in machines for t in cov["total"][m]["unlisted"]]
    rows.append(
        "<p>Never taken: " + html.escape(", ".join(never)) + "</p>"
        if never
        else "<p>Every transition was taken at least once.</p>"
    )
    if unlisted:
        rows.append("<p>Seen but not in the machines: " + html.escape(", ".join(unlisted)) + "</p>")
    return "".join(rows)


def _usage_figure(profile: str, records: dict[int, RunRecord | None]):
    cs = sorted(c for c, r in records.items() if r)
    groups = list(next(records[c] for c in cs).turns[0].barrier.groups)
    fig, axes = plt.subplots(
        len(groups), len(cs), figsize=(3.2 * len(cs), 2.2 * len(groups)), squeeze=False
    )
    for j, c in enumerate(cs):
        turns = records[c].turns
        for i, group in enumerate(groups):
            ax = axes[i][j]
            x = [t.turn for t in turns]
            bottom = [0] * len(x)
            for owner in OWNERS:
                y = [t.barrier.groups[group].by_owner.get(owner, 0) for t in turns]
                if any(y):
                    ax.bar(x, y, bottom=bottom, label=owner)
                    bottom = [b + v for b, v in zip(bottom, y, strict=True)]
            capacity = turns[0].barrier.groups[group].capacity
            empty = "" if any(bottom) else ", none held"
            ax.set_title(f"{group} (of {capacity}), c={c}{empty}", fontsize=9)
            ax.tick_params(labelsize=7)
            if i == len(groups) - 1:
                ax.set_xlabel("turn", fontsize=8)
            if j == 0:
                ax.set_ylabel("pages", fontsize=8)
    handles = {h.get_label(): h for ax in axes.flat for h in ax.get_legend_handles_labels()[0]}
    fig.legend(list(handles.values()), list(handles), loc="upper right", fontsize=8)
    fig.suptitle(f"{profile}: pages by owner at each barrier", fontsize=10)
    fig.tight_layout()
    return fig


def _gauge_figure(profile: str, records: dict[int, RunRecord | None]):
    cs = sorted(c for c, r in records.items() if r)
    fig, axes = plt.subplots(1, len(cs), figsize=(3.6 * len(cs), 3), squeeze=False)
    for j, c in enumerate(cs):
        turns = records[c].turns
        ax = axes[0][j]
        for name in sorted({n for t in turns for n in (t.gauges or {})}):
            ax.plot(
                [t.turn for t in turns], [(t.gauges or {}).get(name, 0) for t in turns], label=name
            )
        ax.set_title(f"c={c}", fontsize=9)
        ax.tick_params(labelsize=7)
    axes[0][0].legend(fontsize=6)
    fig.suptitle(f"{profile}: usage gauges per conversation at each barrier", fontsize=10)
    fig.tight_layout()
    return fig


def _latency(out: Path, profile: str, c: int) -> dict[str, list[float]]:
    """p50/p90/p99 (ms) of TTFT and of the profile's busiest request name."""
    path = out / "runs" / f"{profile}-c{c}" / "locust_stats.csv"
    if not path.exists():
        return {}
    rows = [r for r in csv.DictReader(path.open()) if r["Name"] != "Aggregated"]
    out_rows = {}
    ttft = [r for r in rows if r["Type"] == "TTFT"]
    plain = [r for r in rows if r["Type"] not in ("TTFT", "ITL")]
    if plain:
        busiest = max(plain, key=lambda r: int(r["Request Count"]))
        out_rows[busiest["Name"]] = [float(busiest[p] or 0) for p in PERCENTILES]
    if ttft:
        busiest = max(ttft, key=lambda r: int(r["Request Count"]))
        out_rows[f"TTFT {busiest['Name']}"] = [float(busiest[p] or 0) for p in PERCENTILES]
    return out_rows


def _latency_figure(profile: str, latency: dict[int, dict[str, list[float]]]):
    names = sorted({n for rows in latency.values() for n in rows})
    fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3), squeeze=False)
    cs = sorted(latency)
    for ax, name in zip(axes[0], names, strict=True):
        for k, p in enumerate(PERCENTILES):
            ax.plot(
                cs, [latency[c].get(name, [0, 0, 0])[k] for c in cs], marker="o", label=f"p{p[:-1]}"
            )
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("concurrency", fontsize=8)
        ax.set_ylabel("ms", fontsize=8)
        ax.set_xticks(cs)
        ax.legend(fontsize=7)
    fig.suptitle(f"{profile}: latency percentiles", fontsize=10)
    fig.tight_layout()
    return fig


def _heap_series(
    loaded: dict[tuple[str, int], RunRecord | None],
) -> dict[str, list[tuple[int, float]]]:
    series = {}
    for (profile, c), rec in loaded.items():
        points = [
            (t.turn, t.heap.traced_bytes / t.context_tokens)
            for t in (rec.turns if rec else ())
            if t.heap is not None and t.context_tokens
        ]
        if points:
            series[f"{profile} c={c}"] = points
    return series


def _heap_figure(series: dict[str, list[tuple[int, float]]]):
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for name, points in series.items():
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    ax.set_xlabel("turn")
    ax.set_ylabel("engine heap bytes per context token")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _img(fig, alt: str) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    data = base64.b64encode(buf.getvalue()).decode()
    return f"<p><img alt='{html.escape(alt)}' src='data:image/png;base64,{data}'></p>"
