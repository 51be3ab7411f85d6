"""The audit of one pool's units against their holders, as kvwatch findings (pure functions).

The in-process targets (``sglang/pool_audit.py``, ``lightllm/slot_audit.py``)
read an engine's pool as its free list, its universe (every unit it may give
out) and its holdings (who holds which units: a tree node, a live request,
a session slot; any object with ``units``, ``owner`` and ``who``).
``audit_units`` judges them:

* held by nobody and not free: ``ORPHAN`` (a leak; the detail names the
  unit's last holder, as ``last`` describes it, and whom the engine expects
  to hold units, ``UnitRules.holders``);
* on the free list twice, held twice, or (``UnitRules.outside``) free or held
  outside the universe: ``DOUBLE_OWNED``. What "held twice" is differs by
  engine, so ``UnitRules.twice`` decides it from a unit's holders;
* free and held: ``FREE_AND_OWNED``.

Invariant: a finding's detail names the engine's objects (as the holdings'
``who`` name them, and pool indices), never kvwatch's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, NamedTuple

from kvwatch.contracts import Finding, FindingKind, finding

SHOWN = 8  # ranges, holders and mismatches named in one finding
DOUBLES = 4  # units held twice named, a finding each


class UnitRules(NamedTuple):
    """What an engine counts as wrong beyond the rules every pool shares."""

    holders: str  # whom an allocated unit must be held by, as the orphan finding says it
    twice: Callable[[Sequence[Any]], bool]  # whether a unit's holders hold it twice
    outside: bool = False  # free or held units outside the universe are double owned


def ranges(units: Iterable[int]) -> str:
    """``3-5, 9, 12-13``: sorted units as ranges (the first ``SHOWN``, then a count)."""
    units = sorted(units)
    out: list[str] = []
    start = None
    for i, u in enumerate(units):
        start = u if start is None else start
        if i + 1 == len(units) or units[i + 1] != u + 1:
            out.append(f"{start}" if start == u else f"{start}-{u}")
            start = None
    more = f" (+{len(out) - SHOWN} ranges)" if len(out) > SHOWN else ""
    return ", ".join(out[:SHOWN]) + more


def owners_of(held: Iterable[Any]) -> dict[int, list[Any]]:
    """Each held unit's holders, in the order the holdings list them."""
    owners: dict[int, list[Any]] = {}
    for h in held:
        for u in h.units:
            owners.setdefault(u, []).append(h)
    return owners


def _double(group: str, free: Counter, owners: dict[int, list[Any]], rules: UnitRules):
    out = []
    twice_free = sorted(u for u, c in free.items() if c > 1)
    if twice_free:
        detail = f"{group}: {len(twice_free)} units on the free list twice: {ranges(twice_free)}"
        out.append(finding(FindingKind.DOUBLE_OWNED, group, twice_free, detail))
    double = sorted((u, hs) for u, hs in owners.items() if rules.twice(hs))
    for u, hs in double[:DOUBLES]:
        detail = f"{group}: unit {u} held by " + " and ".join(h.who for h in hs)
        out.append(finding(FindingKind.DOUBLE_OWNED, group, [u], detail))
    return out


def _outside(group: str, free: Counter, owners: dict, universe: Collection[int]):
    outside = sorted(u for u in set(free) | set(owners) if u not in universe)
    if not outside:
        return []
    detail = f"{group}: units outside the pool's {len(universe)} free or held: {ranges(outside)}"
    return [finding(FindingKind.DOUBLE_OWNED, group, outside, detail)]


def _free_and_held(group: str, free: Counter, owners: dict[int, list[Any]]) -> list[Finding]:
    both = sorted(u for u in owners if u in free)
    if not both:
        return []
    who = "; ".join(sorted({h.who for u in both[:SHOWN] for h in owners[u]}))
    detail = f"{group}: {len(both)} units free and held: {ranges(both)} by {who}"
    return [finding(FindingKind.FREE_AND_OWNED, group, both, detail)]


def _orphans(group: str, orphans: list[int], last: Callable[[str, int], str], holders: str):
    if not orphans:
        return []
    lasts = Counter(last(group, u) for u in orphans)
    named = "; ".join(f"{n} last held by {who}" for who, n in lasts.most_common(6))
    detail = (
        f"{group}: {len(orphans)} units allocated but held by {holders}: "
        f"{ranges(orphans)} ({named})"
    )
    return [finding(FindingKind.ORPHAN, group, orphans, detail)]


def audit_units(
    group: str,
    free: Sequence[int],
    universe: Collection[int],
    held: Sequence[Any],
    last: Callable[[str, int], str],
    rules: UnitRules,
) -> tuple[list[Finding], Counter]:
    """The findings of one pool, and its held units by owner kind (a unit the tree
    holds counts as the tree's)."""
    free_count = Counter(free)
    owners = owners_of(held)
    orphans = sorted(set(universe) - set(free_count) - set(owners))
    found = _double(group, free_count, owners, rules)
    if rules.outside:
        found += _outside(group, free_count, owners, universe)
    found += _free_and_held(group, free_count, owners)
    found += _orphans(group, orphans, last, rules.holders)
    counts: Counter = Counter()
    for hs in owners.values():
        counts["tree" if any(h.owner == "tree" for h in hs) else hs[0].owner] += 1
    return found, counts
