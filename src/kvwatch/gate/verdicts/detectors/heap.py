"""heap: retained memory per live context token must not rise with turns, and a
finished request must leave nothing behind.

* Per context token. Retained memory that grows with the context
  (O(prefix)) keeps the ratio flat; memory that grows with turns times
  prefix makes it climb. The ratio is judged for all of kvwatch's
  allocations and for each allocation site on its own, so a leak at one site
  is not drowned by memory that grows with the context. The tokens are the
  live conversations' context, or the prefix cache's when it holds more
  (evictable cache is bounded by the pool, not a leak); a site must also
  have grown by ``MIN_SITE_GROWTH`` bytes, and is judged together with the
  sites it took memory over from (``moved_from``). The evidence is that site and the
  top growth by traceback (``Snapshot.compare_to``) at the failing turn.
* Per request. The heap is marked at the barrier that ends the warm-up and
  sampled again once the run has drained, closed its sessions and flushed:
  everything the judged turns built is gone by then. A site that kept about
  one allocation and a few bytes per request served since the mark is a
  leak (a per-request map never pruned, say); one-off growth (a table that
  stays grown, a cache filled once) is neither.
* Per closed session. The same, against the sessions closed since the mark:
  a session leaves more behind than a request (its tokens, its records), but
  there are far fewer of them, so what each one keeps would hide under the
  per-request threshold.
* By census, at every concurrency. tracemalloc costs every allocation, so
  the server traces only at low concurrency; a census (live instances of
  each kvwatch class, ``kvwatch.instrumentation.census``) costs two counts a run. A class with
  about one more instance per two requests served, or one per session closed,
  once the run drained, is kept by something that outlived its owner.
"""

from __future__ import annotations

from kvwatch.gate.verdicts.detectors.stats import first_rise
from kvwatch.gate.verdicts.detectors.verdict import (
    Evidence,
    Verdict,
    fail,
    fail_after_drain,
    passed,
    skipped,
)
from kvwatch.harness.run_record import RunRecord, Signal

ID = "heap"
NEEDS = frozenset({Signal.HEAP})


# Memory that merely fills up towards O(prefix) in the first judged turns
# creeps a little, and a list's over-allocation grows it in steps; a leak adds
# a whole prefix per turn. Ask for 10% a turn, and at least 1.5 bytes per
# context token a turn (a token list is 8 bytes per token all told).
MIN_RELATIVE_SLOPE = 0.10
MIN_BYTES_PER_TOKEN_TURN = 1.5
# A site is one of some forty judged in every run, so a short monotone series
# comes up by chance now and then; a leak worth a finding has also grown by
# this much over the judged turns (a 4 KB token list is a 500-token prefix).
MIN_SITE_GROWTH = 8192
# A site that lost at least this share of a rising site's growth is judged
# with it (``moved_from``).
MOVED_SHARE = 0.25
TOTAL = "all kvwatch allocations"
# Per request: a map entry costs a few dozen bytes (key, value, slot), and at
# least one allocation of its own.
MIN_BYTES_PER_REQUEST = 16
MIN_ALLOCATIONS_PER_REQUEST = 0.5
MIN_LEFT_BYTES = 4096
# Per closed session: a session keeps its tokens and records (hundreds of bytes
# at the least) in at least one allocation of its own.
MIN_BYTES_PER_SESSION = 64
MIN_ALLOCATIONS_PER_SESSION = 1
MIN_SESSIONS = 2
# By census: instances of one class left per request (one per two: a request
# and its reply share nothing), never fewer than a handful in all.
MIN_INSTANCES_PER_REQUEST = 0.5
MIN_INSTANCES_LEFT = 4


def detect(run: RunRecord) -> Verdict:
    turns = [t for t in run.turns if t.heap is not None and t.context_tokens > 0]
    if not turns and run.heap_end is None and run.census_end is None:
        return skipped(ID, "no heap samples and no census (heap tracking off)")
    verdicts = [token_rule(run, turns) if turns else None]
    for rule in (request_rule, session_rule, census_rule):
        if verdicts[-1] is not None and verdicts[-1].failed:
            break
        verdicts.append(rule(run))
    done = [v for v in verdicts if v is not None]
    failed = next((v for v in done if v.failed), None)
    if failed is not None:
        return failed
    if not turns and run.heap_end is None:
        return passed(ID, "heap not traced at this concurrency; " + "; ".join(v.note for v in done))
    return passed(ID, "; ".join(v.note for v in done))


def _served_since_mark(run: RunRecord) -> int:
    """Requests the clients sent between the warm-up's last barrier and the end."""
    mark = run.warmup - 1
    if run.requests is None or not 0 <= mark < len(run.turns):
        return 0
    before = run.turns[mark].requests
    return run.requests.requests - (before.requests if before is not None else 0)


def _closed_since_mark(run: RunRecord) -> int:
    """Sessions the engine closed between the warm-up's last barrier and the drain."""
    mark = run.warmup - 1
    if run.drained is None or not 0 <= mark < len(run.turns):
        return 0
    barrier = run.turns[mark].barrier
    return run.drained.stats.sessions_closed - (barrier.stats.sessions_closed if barrier else 0)


def session_rule(run: RunRecord) -> Verdict | None:
    """Sites that kept an allocation and some bytes for every session closed
    since the mark, once the run is over."""
    closed = _closed_since_mark(run)
    if run.heap_end is None or closed < MIN_SESSIONS:
        return None
    kept = _kept_per(run, closed, MIN_BYTES_PER_SESSION, MIN_ALLOCATIONS_PER_SESSION)
    if not kept:
        return passed(ID, f"nothing left per session ({closed} closed since the warm-up)")
    each = f"closed session ({closed} since turn {run.warmup - 1})"
    return fail_after_drain(ID, run, _left_evidence(kept, closed, each))


def census_rule(run: RunRecord) -> Verdict | None:
    """kvwatch classes with more live instances once the run drained than at the
    warm-up's end, by about one per two requests served or one per session closed."""
    if run.census_mark is None or run.census_end is None:
        return None
    served, closed = _served_since_mark(run), _closed_since_mark(run)
    grown = {
        cls: n - run.census_mark.get(cls, 0)
        for cls, n in run.census_end.items()
        if n > run.census_mark.get(cls, 0)
    }

    def kept(n: int) -> bool:
        per_request = served > 0 and n >= max(
            MIN_INSTANCES_LEFT, MIN_INSTANCES_PER_REQUEST * served
        )
        per_session = closed >= MIN_SESSIONS and n >= max(MIN_INSTANCES_LEFT, closed)
        return per_request or per_session

    left = sorted(((n, cls) for cls, n in grown.items() if kept(n)), reverse=True)
    if not left:
        return passed(ID, f"census back at its level ({served} requests, {closed} sessions)")
    ev = [
        Evidence(
            group=None,
            pages=(),
            detail=f"{cls}: {n} more live instances after the run than at the end of the "
            f"warm-up ({served} requests served, {closed} sessions closed since)",
        )
        for n, cls in left
    ]
    return fail_after_drain(ID, run, ev)


def request_rule(run: RunRecord) -> Verdict | None:
    """Sites that kept about an allocation and a few bytes for every request the
    judged turns served, once the run is over (``heap_end.since_mark``)."""
    served = _served_since_mark(run)
    if run.heap_end is None or served <= 0:
        return None
    kept = _kept_per(run, served, MIN_BYTES_PER_REQUEST, MIN_ALLOCATIONS_PER_REQUEST)
    if not kept:
        total = sum(g.size_diff for g in run.heap_end.since_mark)
        return passed(ID, f"{total / served:.0f} bytes left per request after the run")
    each = f"request ({served} requests since turn {run.warmup - 1})"
    return fail_after_drain(ID, run, _left_evidence(kept, served, each))


def _kept_per(run: RunRecord, units: int, min_bytes: float, min_allocations: float) -> list:
    """The sites of ``heap_end.since_mark`` that kept at least ``min_bytes`` and
    ``min_allocations`` for each of ``units`` (requests served or sessions closed
    since the mark), and never less than ``MIN_LEFT_BYTES`` in all."""
    return [
        g
        for g in run.heap_end.since_mark
        if g.size_diff >= max(MIN_LEFT_BYTES, min_bytes * units)
        and g.count_diff >= min_allocations * units
    ]


def _left_evidence(kept: list, units: int, each: str) -> list[Evidence]:
    """``SITE: B bytes in N allocations left after the run, B/units bytes per EACH``."""
    return [
        Evidence(
            group=None,
            pages=(),
            detail=f"{g.site}: {g.size_diff} bytes in {g.count_diff} allocations left after the run, "
            f"{g.size_diff / units:.0f} bytes per {each}",
            traceback=(g.site,),
        )
        for g in kept
    ]


def bytes_per_held_token(turn) -> float | None:
    """Traced heap bytes over the turn's held tokens (``held_tokens``): the one ratio
    the detector judges, summary.json reports and the report plots."""
    held = held_tokens(turn)
    if turn.heap is None or held <= 0:
        return None
    return turn.heap.traced_bytes / held


def held_tokens(turn) -> int:
    """The tokens memory may scale with at this barrier: the live conversations'
    context, or what the prefix cache holds when that is more (cold prompts
    stay cached after their conversations end; the pool bounds them)."""
    probe = turn.barrier
    cached = probe.stats.tree.tokens if probe is not None else 0
    return max(turn.context_tokens, cached)


def moved_from(site: str, grown: int, judged: list) -> tuple[str, ...]:
    """The sites that lost a good share of what ``site`` gained over the
    ``judged`` turns, and held memory all along until the last of them: it is
    judged together with them. tracemalloc files a block under the line that
    last (re)allocated it, so a list one line builds and another extends (a
    session's tokens: decoded by the scheduler, extended by the next turn)
    moves from one site to the other as it grows; one site rises while the
    other falls, and nothing new was kept. The fall is counted from the
    other site's peak over the judged turns: it keeps growing too (new lists
    start there) while it lends, so its first and last samples can be close
    though it lent a great deal. A site that held memory at one sample only
    (a buffer in flight, as a span file's) lent none to it."""
    samples = [t.heap.by_site or {} for t in judged]
    before, after = samples[0], samples[-1]
    return tuple(
        name
        for name in sorted(set(before) - {site})
        if max(s.get(name, 0) for s in samples) - after.get(name, 0) >= MOVED_SHARE * grown
        and all(s.get(name, 0) > 0 for s in samples[:-1])
    )


def _rise(run: RunRecord, numbers: list[int], sizes: list[float], tokens: list[int]):
    """``first_rise`` of ``sizes`` per token of ``tokens``, and that ratio."""
    ratio = [b / n for b, n in zip(sizes, tokens, strict=True)]
    rise = first_rise(numbers, ratio, run.warmup, MIN_RELATIVE_SLOPE, MIN_BYTES_PER_TOKEN_TURN)
    return rise, ratio


def token_rule(run: RunRecord, turns: list) -> Verdict:
    """A site (or the total) rises per held token and per token of live context
    alike. Memory that scales with the context is flat per context token but
    climbs per held token while the cache holds more than the context and grows
    slower (cold prompts cached by the page); memory that scales with the cache
    is the other way round; a leak of turns x prefix climbs against both."""
    numbers = [t.turn for t in turns]
    judged = turns[min(run.warmup, max(0, len(turns) - 4)) :]
    held = [held_tokens(t) for t in turns]
    context = [t.context_tokens for t in turns]
    sizes = {TOTAL: [float(t.heap.traced_bytes) for t in turns]}
    # a site is followed only if every judged sample saw it (the samples keep the top sites)
    common = set.intersection(*(set(t.heap.by_site or {}) for t in judged))
    for site in common:
        grown = judged[-1].heap.by_site[site] - judged[0].heap.by_site[site]
        if grown >= MIN_SITE_GROWTH:
            together = (site, *moved_from(site, grown, judged))
            sizes[site] = [sum((t.heap.by_site or {}).get(s, 0) for s in together) for t in turns]
    worst = None
    for site, size in sizes.items():
        rise, ratio = _rise(run, numbers, size, held)
        also, _ = _rise(run, numbers, size, context)
        if rise is None or also is None:
            continue
        rise = (max(rise[0], also[0]), rise[1])
        # the earliest rise wins; on a tie, a named site says more than the total
        if worst is None or (rise[0], site == TOTAL) < (worst[1], worst[0] == TOTAL):
            worst = (site, rise[0], rise[1], ratio)
    if worst is None:
        total = [b / n for b, n in zip(sizes[TOTAL], held, strict=True)]
        return passed(
            ID, f"{total[-1]:.0f} bytes per held token, no site rising over {len(turns)} turns"
        )
    site, at, trend, ratio = worst
    sample = next(t.heap for t in turns if t.turn == at)
    ev = [
        Evidence(
            group=None,
            pages=(),
            detail=f"{site}: retained bytes per held token rise {ratio[0]:.1f} -> {ratio[-1]:.1f}, "
            f"and per context token too (O(turns x prefix)): {trend.describe}",
            traceback=(site,),
        )
    ]
    ev += [
        Evidence(
            group=None, pages=(), detail=f"+{size} bytes since the previous turn", traceback=tb
        )
        for size, tb in sample.top[:5]
    ]
    return fail(ID, at, ev)
