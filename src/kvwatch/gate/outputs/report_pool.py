"""The pool figure: pages per group and concurrency at every barrier.

Each panel has one column per barrier: the pages by owner, stacked (the
tree's pinned pages solid; its evictable cache only outlined, since
eviction takes it back on demand and it is no leak however high it gets).
Inside the column, not beside it, narrow bars mark the subsets that matter:
the pages held by no live holder (LEAKED, still under their last owner's tag,
so counted once) and the pinned pages over the bound live holders justify
(OVER), each with its count above it. The capacity is a line (above an axis
break when the pool is far from full, so small counts stay readable), and a
dashed line with a label marks where a detector of that run first failed.
Groups that held nothing at any barrier of any concurrency get no panel
(the page says so).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from matplotlib.transforms import blended_transform_factory

from kvwatch.gate.outputs.report_data import STACK, GroupSeries
from kvwatch.gate.outputs.report_plots import LEAKED, OVER, Fail, plt

STACK_COLORS = {
    "session": "#4c72b0",
    "request": "#55a868",
    "slot": "#8172b2",
    "tree, pinned": "#7f5f3f",
    "tree, evictable": "#9c8558",  # an outline only: cache, not held
    "untagged": "#8c8c8c",
}
SPLIT_AXIS = 1.6  # capacity above this many times the peak: break the axis below the capacity
INSIDE = (
    ("leaked", LEAKED, -0.09, "of these, leaked: held by no live holder"),
    ("over_bound", OVER, 0.09, "of these, pinned over the bound live holders justify"),
)


def held_groups(series: Mapping[int, Sequence[GroupSeries]]) -> list[str]:
    """Groups, in the probe's order, that held something at some barrier of some run."""
    first = next(iter(series.values()))
    return [
        g.group
        for g in first
        if any(s.group == g.group and s.held for v in series.values() for s in v)
    ]


def pool_figure(
    profile: str, series: Mapping[int, Sequence[GroupSeries]], fails: Mapping[int, Sequence[Fail]]
):
    """Rows: the groups that held anything; columns: concurrencies."""
    cs = sorted(series)
    groups = held_groups(series)
    width = max(5.4 * len(cs), 8.0)  # the title fits over a single column
    fig = plt.figure(figsize=(width, 2.7 * len(groups) + 0.7), layout="constrained")
    outer = fig.add_gridspec(len(groups), len(cs))
    for i, group in enumerate(groups):
        for j, c in enumerate(cs):
            g = next(s for s in series[c] if s.group == group)
            ax = _panel(fig, outer[i, j], g, c, fails.get(c, ()))
            if i == len(groups) - 1:
                ax.set_xlabel("turn", fontsize=8)
    handles = {h.get_label(): h for ax in fig.axes for h in ax.get_legend_handles_labels()[0]}
    fig.legend(
        list(handles.values()), list(handles), loc="outside lower center", ncol=4, fontsize=8
    )
    fig.suptitle(
        f"{profile}: pages per group at each barrier (before the load, each turn, drained)",
        fontsize=10,
    )
    return fig


def _panel(fig, spec, g: GroupSeries, c: int, fails: Sequence[Fail]):
    """One group at one concurrency; returns the axes that hold the bars."""
    xs = [p.x for p in g.points]
    peak = max(max(sum(p.stack.values()), p.host, p.leaked, p.over_bound, 1) for p in g.points)
    ax, top = _axes(fig, spec, g.capacity, peak)
    _capacity_line(top, g.capacity)
    _owner_stack(ax, g, xs)
    hosts = [p.host for p in g.points]
    if any(hosts):
        ax.plot(xs, hosts, color="#333333", linestyle=":", marker=".", label="host tier pages")
    _inside_bars(ax, g, xs)
    leaked = max(p.leaked for p in g.points)
    said = f"up to {leaked} leaked pages" if leaked else "nothing leaked"
    top.set_title(f"{g.group}, c={c}: {said}", fontsize=9, color=LEAKED if leaked else "black")
    ax.set_xticks(xs, [p.label for p in g.points])
    ax.set_xlim(min(xs) - 0.6, max(xs) + 0.7)
    ax.tick_params(labelsize=7)
    ax.set_ylabel("pages", fontsize=8)
    _mark_fails(ax, fails, (min(xs) + max(xs)) / 2)
    return ax


def _capacity_line(top, capacity: int) -> None:
    """The pool's capacity: a dash-dotted line, its value written at its left end."""
    where = blended_transform_factory(top.transAxes, top.transData)
    top.axhline(capacity, color="#222222", linestyle="-.", linewidth=1.2, label="capacity")
    top.text(0.01, capacity, f" capacity {capacity}", transform=where, fontsize=7, va="bottom")


def _owner_stack(ax, g: GroupSeries, xs: list[int]) -> None:
    """The pages by owner at each barrier, stacked in STACK's order; owners that
    held nothing at any barrier get no bar (and no legend entry)."""
    bottom = [0] * len(xs)
    for name in STACK:
        ys = [p.stack[name] for p in g.points]
        if not any(ys):
            continue
        cache = name == "tree, evictable"
        ax.bar(
            xs,
            ys,
            0.5,
            bottom=bottom,
            color="none" if cache else STACK_COLORS[name],
            edgecolor=STACK_COLORS[name] if cache else "white",
            linestyle=":" if cache else "-",
            linewidth=1.0 if cache else 0.3,
            label="tree, evictable (cache, taken back on demand)" if cache else name,
        )
        bottom = [b + y for b, y in zip(bottom, ys, strict=True)]


def _inside_bars(ax, g: GroupSeries, xs: list[int]) -> None:
    """Inside each column, from its foot: the leaked pages (LEAKED) and the pinned
    pages over the bound (OVER, hatched so the two stay apart printed in grey),
    each nonzero bar with its count above it. Both are subsets of the column."""
    for k, (field, color, offset, label) in enumerate(INSIDE):
        ys = [getattr(p, field) for p in g.points]
        if not any(ys):
            continue
        ax.bar(
            [x + offset for x in xs],
            ys,
            0.14,
            color=color,
            hatch="xx" if color == OVER else None,
            edgecolor="white",
            linewidth=0,
            label=label,
        )
        for x, y in zip(xs, ys, strict=True):
            if y:  # the second count one line higher, so two counts never overlap
                ax.annotate(
                    str(y),
                    (x + offset, y),
                    xytext=(0, 2 + 9 * k),
                    textcoords="offset points",
                    color=color,
                    fontsize=7,
                    fontweight="bold",
                    ha="center",
                    va="bottom",
                )


def _axes(fig, spec, capacity: int, peak: int):
    """(bars, capacity) axes: one axes when the capacity is near the data, else a
    short strip with the capacity above a break and the bars on their own scale."""
    if capacity <= SPLIT_AXIS * peak:
        ax = fig.add_subplot(spec)
        ax.set_ylim(0, max(capacity, peak) * 1.15)
        return ax, ax
    inner = spec.subgridspec(2, 1, height_ratios=(1, 5), hspace=0.02)
    top, ax = fig.add_subplot(inner[0]), fig.add_subplot(inner[1])
    top.sharex(ax)
    top.set_ylim(capacity * 0.9, capacity * 1.08)
    top.set_yticks([capacity])
    top.tick_params(labelbottom=False, bottom=False, labelsize=7)
    top.spines["bottom"].set_visible(False)
    ax.spines["top"].set_visible(False)
    ax.set_ylim(0, peak * 1.3)
    for a, y in ((top, 0), (ax, 1)):  # the break marks
        a.plot(
            [0, 1],
            [y, y],
            transform=a.transAxes,
            marker=[(-1, -0.5), (1, 0.5)],
            markersize=8,
            linestyle="none",
            color="k",
            clip_on=False,
        )
    return ax, top


def _mark_fails(ax, fails: Sequence[Fail], middle: float) -> None:
    """A dashed line just before each failing position, its label on the side
    with more room (left of the line in the right half)."""
    at: dict[int, list[str]] = {}
    for x, what in fails:
        at.setdefault(x, []).append(what)
    where = blended_transform_factory(ax.transData, ax.transAxes)
    for x, names in sorted(at.items()):
        line = x - 0.45
        ax.axvline(line, color="black", linestyle="--", linewidth=1.2)
        right = x > middle
        ax.text(
            line + (-0.03 if right else 0.03),
            0.97,
            "\n".join(names),
            transform=where,
            fontsize=7,
            va="top",
            ha="right" if right else "left",
            bbox={"facecolor": "white", "edgecolor": "black", "linewidth": 0.5, "pad": 1.5},
        )
