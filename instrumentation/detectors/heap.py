"""heap: tracemalloc bytes retained per live context token must not rise with turns.

Retained memory that grows with the context (O(prefix)) keeps the ratio
flat; memory that grows with turns times prefix makes it climb. The ratio is
judged for all engine allocations and for each allocation site on its own,
so a leak at one site is not drowned by memory that grows with the context.
The evidence is that site and the top growth by traceback
(``Snapshot.compare_to``) at the failing turn.
"""

from __future__ import annotations

from kvwatch.instrumentation.detectors.base import Evidence, Verdict, fail, passed, skipped
from kvwatch.instrumentation.detectors.stats import first_rise
from kvwatch.instrumentation.record import RunRecord

ID = "heap"


# Memory that merely fills up towards O(prefix) in the first judged turns
# creeps a little, and a list's over-allocation grows it in steps; a leak adds
# a whole prefix per turn. Ask for 10% a turn, and at least 1.5 bytes per
# context token a turn (a token list is 8 bytes per token all told).
MIN_RELATIVE_SLOPE = 0.10
MIN_BYTES_PER_TOKEN_TURN = 1.5
TOTAL = "all engine allocations"


def detect(run: RunRecord) -> Verdict:
    turns = [t for t in run.turns if t.heap is not None and t.context_tokens > 0]
    if not turns:
        return skipped(ID, "no heap samples (heap tracking off)")
    numbers = [t.turn for t in turns]
    judged = turns[min(run.warmup, max(0, len(turns) - 4)) :]
    series = {TOTAL: [t.heap.traced_bytes / t.context_tokens for t in turns]}
    # a site is followed only if every judged sample saw it (the samples keep the top sites)
    common = set.intersection(*(set(t.heap.by_site or {}) for t in judged))
    for site in common:
        series[site] = [(t.heap.by_site or {}).get(site, 0) / t.context_tokens for t in turns]
    worst = None
    for site, ratio in series.items():
        rise = first_rise(numbers, ratio, run.warmup, MIN_RELATIVE_SLOPE, MIN_BYTES_PER_TOKEN_TURN)
        # the earliest rise wins; on a tie, a named site says more than the total
        if rise is not None and (
            worst is None or (rise[0], site == TOTAL) < (worst[1], worst[0] == TOTAL)
        ):
            worst = (site, rise[0], rise[1], ratio)
    if worst is None:
        total = series[TOTAL]
        return passed(
            ID, f"{total[-1]:.0f} bytes per context token, no site rising over {len(turns)} turns"
        )
    site, at, trend, ratio = worst
    sample = next(t.heap for t in turns if t.turn == at)
    ev = [
        Evidence(
            None,
            (),
            f"{site}: retained bytes per context token rise {ratio[0]:.1f} -> {ratio[-1]:.1f} "
            f"(O(turns x prefix)): {trend.describe}",
            (site,),
        )
    ]
    ev += [
        Evidence(None, (), f"+{size} bytes since the previous turn", tb)
        for size, tb in sample.top[:5]
    ]
    return fail(ID, at, ev)
