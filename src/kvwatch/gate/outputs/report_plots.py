"""The report's figures (matplotlib, Agg), from ``report_data``'s series.

Every number a figure encodes by colour is also written on it or in the
page's text: the page is read printed or as a CI artifact's preview, where
nothing can be hovered. LEAKED, the colour of pages held by no live holder,
is used for nothing else, so a clean report has no pixel of it.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.transforms import blended_transform_factory

from kvwatch.gate.outputs.report_data import PERCENTILES, StepSeries

LEAKED = "#e8000b"  # pages held by no live holder: only ever drawn for them
OVER = "#9b0a7d"  # pinned pages beyond what live holders justify
LINES = ("#1f4e79", "#2a9d8f", "#7b6d00", "#5e548e", "#3d405b", "#6a994e", "#264653", "#9c6644")
PERCENTILE_COLORS = ("#1f4e79", "#4a90c2", "#a6cbe8")
DPI = 100

Fail = tuple[int, str]  # (position on the turn axis, what failed there)


def png(fig) -> str:
    """The figure as a base64 PNG, closed once written."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def steps_figure(
    profile: str, series: Mapping[int, StepSeries], fails: Mapping[int, Sequence[Fail]]
):
    """Used pages (% of capacity) at every probe, per concurrency: the barriers
    dotted and labelled, a turn where a detector first failed shaded, probes
    that found pages held by no live holder crossed in LEAKED along the top."""
    cs = sorted(series)
    fig, axes = plt.subplots(
        1, len(cs), figsize=(max(5.4 * len(cs), 8.0), 3.4), squeeze=False, layout="constrained"
    )
    for ax, c in zip(axes[0], cs, strict=True):
        s = series[c]
        top = _usage_lines(ax, s)
        _barriers(ax, s, {x for x, _ in fails.get(c, ())})
        if s.flagged:
            _leak_marks(ax, s.flagged, top)
        ax.set_title(f"c={c}", fontsize=9)
        ax.set_xlabel("engine step (probes carry steps, not clock times)", fontsize=8)
        ax.set_ylabel("used, % of capacity", fontsize=8)
        ax.tick_params(labelsize=7)
    handles = {h.get_label(): h for ax in fig.axes for h in ax.get_legend_handles_labels()[0]}
    fig.legend(
        list(handles.values()), list(handles), loc="outside lower center", ncol=3, fontsize=7
    )
    fig.suptitle(f"{profile}: pool usage at every probe while the turns ran", fontsize=10)
    return fig


def _usage_lines(ax, s: StepSeries) -> float:
    """One line per group, used % of capacity at every probe; returns the highest
    value drawn, with the y axis leaving room above it for the leak marks."""
    for k, (group, used) in enumerate(s.used.items()):
        label = f"{group} (capacity {s.capacity[group]})"
        ax.plot(
            s.steps,
            used,
            color=LINES[k % len(LINES)],
            marker=".",
            markersize=3,
            linewidth=1,
            label=label,
        )
    top = max(max(u) for u in s.used.values())
    ax.set_ylim(0, top * 1.25 + 1)
    return top


def _barriers(ax, s: StepSeries, failed: set[int]) -> None:
    """Each turn's barrier as a dotted line labelled with its turn; a turn in
    ``failed`` (where a detector first failed) shaded from the barrier before it."""
    where = blended_transform_factory(ax.transData, ax.transAxes)
    previous = s.steps[0]
    for turn, step in s.barriers:
        if turn in failed:
            ax.axvspan(
                previous,
                step,
                color="#f4d6d6",
                zorder=0,
                label="turn where a detector first failed",
            )
        ax.axvline(step, color="#777777", linestyle=":", linewidth=0.8)
        ax.text(
            step,
            0.02,
            f"turn {turn}",
            transform=where,
            fontsize=6,
            rotation=90,
            va="bottom",
            ha="right",
        )
        previous = step


def _leak_marks(ax, flagged: Sequence[int], top: float) -> None:
    """A LEAKED cross above the lines at every probe that found pages held by no
    live holder."""
    ax.plot(
        flagged,
        [top * 1.15 + 0.5] * len(flagged),
        linestyle="none",
        marker="x",
        color=LEAKED,
        label="a probe found pages held by no live holder",
    )


def latency_figure(profile: str, latency: Mapping[str, Mapping[int, tuple[float, ...]]]):
    """Percentiles per concurrency of the profile's chosen rows; no data is a gap, never 0."""
    names = list(latency)
    fig, axes = plt.subplots(
        1,
        len(names),
        figsize=(max(4.2 * len(names), 8.0), 3.0),
        squeeze=False,
        layout="constrained",
    )
    for ax, name in zip(axes[0], names, strict=True):
        per_c = latency[name]
        cs = sorted(per_c)
        for k, p in enumerate(PERCENTILES):
            ax.plot(
                cs,
                [per_c[c][k] for c in cs],
                marker="o",
                color=PERCENTILE_COLORS[k],
                label=f"p{p[:-1]}",
            )
        missing = [c for c in cs if all(math.isnan(v) for v in per_c[c])]
        for c in missing:
            ax.text(
                c,
                0.05,
                "no data",
                transform=blended_transform_factory(ax.transData, ax.transAxes),
                fontsize=7,
                ha="center",
                rotation=90,
            )
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("concurrency", fontsize=8)
        ax.set_ylabel("ms", fontsize=8)
        ax.set_xticks(cs)
        peak = max((v for c in cs for v in per_c[c] if not math.isnan(v)), default=1.0)
        ax.set_ylim(0, peak * 1.12)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"{profile}: latency percentiles (the same rows at every concurrency)", fontsize=10
    )
    return fig


def gauge_figure(profile: str, turns_by_c: Mapping[int, Sequence]):
    """Black-box gauges per conversation at each barrier; a missing reading is a gap."""
    cs = sorted(turns_by_c)
    fig, axes = plt.subplots(
        1, len(cs), figsize=(max(4.2 * len(cs), 8.0), 3), squeeze=False, layout="constrained"
    )
    for ax, c in zip(axes[0], cs, strict=True):
        turns = turns_by_c[c]
        names = sorted({n for t in turns for n in (t.gauges or {})})
        for k, name in enumerate(names):
            ys = [(t.gauges or {}).get(name, math.nan) for t in turns]
            ax.plot(
                [t.turn for t in turns], ys, marker=".", color=LINES[k % len(LINES)], label=name
            )
        ax.set_title(f"c={c}", fontsize=9)
        ax.set_xlabel("turn", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    fig.suptitle(f"{profile}: usage gauges per conversation at each barrier", fontsize=10)
    return fig


def heap_figure(series: Mapping[str, Sequence[tuple[int, float]]]):
    fig, ax = plt.subplots(figsize=(7, 3.5), layout="constrained")
    for k, (name, points) in enumerate(series.items()):
        ax.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            marker="o",
            color=LINES[k % len(LINES)],
            label=name,
        )
    ax.set_xlabel("turn")
    ax.set_ylabel("heap bytes per held token")
    peak = max((p[1] for points in series.values() for p in points), default=1.0)
    ax.set_ylim(0, peak * 1.15)  # from 0: a flat series must look flat
    ax.legend(fontsize=7)
    return fig
