"""The pool gauges' truth at the drain: each says what the probe counts, and the
evictable figures are what the flush then frees.

A dashboard, an autoscaler or an alert reads ``kvwatch_pool_pages`` and
believes it. Two promises are checked where the record holds the pool gauges
read around a probe of the idle engine (at every turn barrier, and on both
sides of the drain's flush: ``harness/flush_reading.py``; kvwatch's own
server, white-box):

* each state's gauge, per group, equals the probe of the same moment (read
  before and after the probe, and kept only when both reads agree), by the
  state's definition below;
* ``evictable`` before the flush equals the device pages the flush freed, and
  ``host_evictable`` the host pages it freed: the flush takes back everything
  nobody references, and nothing else, so a figure that counts pages the
  flush cannot free (or leaves out pages it does) lies to whoever sizes the
  cache by it.

The states, as the gauge promises them (``instrumentation/names.py``)::

    free            pages on the free stack        used    capacity - free
    evictable       tree pages eviction or pruning may take back
    pinned_request  pages held by running requests
    pinned_session  pages held by sessions between turns
    host            host-tier pages a retracted request will recover from
    host_evictable  host-tier pages nobody will recover from (cache)
"""

from __future__ import annotations

from kvwatch.contracts import GroupReport, ProbeReport
from kvwatch.gate.detectors.verdict import Evidence
from kvwatch.harness.run_record import RunRecord
from kvwatch.harness.scrape import parse_spec

POOL_PAGES = "kvwatch_pool_pages"


def promised(g: GroupReport) -> dict[str, int]:
    """What each state's gauge must say of a group the probe reports as ``g``."""
    host_cache = g.by_owner.get("host_evictable", 0)
    return {
        "free": g.free,
        "used": g.capacity - g.free,
        "evictable": g.evictable,
        "pinned_request": g.by_owner.get("request", 0),
        "pinned_session": g.by_owner.get("session", 0),
        "host": g.by_owner.get("host", 0) - host_cache,
        "host_evictable": host_cache,
    }


def by_group(gauges: dict[str, float]) -> dict[tuple[str, str], float]:
    """The pool gauges read, by (group, state)."""
    out = {}
    for series, value in gauges.items():
        name, labels = parse_spec(series)
        if name == POOL_PAGES and "group" in labels and "state" in labels:
            out[labels["group"], labels["state"]] = value
    return out


def read(run: RunRecord) -> int:
    """How many probes the record holds pool gauges beside (barriers, the flush's two)."""
    barriers = sum(1 for t in run.turns if t.pool_gauges is not None and t.barrier is not None)
    return barriers + (2 if run.flushed is not None else 0)


def untrue_at_barriers(run: RunRecord) -> tuple[int, list[Evidence]] | None:
    """The first barrier whose pool gauges disagree with its probe, and how."""
    for turn in run.turns:
        if turn.pool_gauges is not None and turn.barrier is not None:
            when = f"at turn {turn.turn}"
            if ev := _against_probe(turn.barrier, by_group(turn.pool_gauges), when):
                return turn.turn, ev
    return None


def untrue_at_flush(run: RunRecord) -> list[Evidence]:
    """Every gauge that disagrees with the probe around the drain's flush, and every
    evictable figure that disagrees with what the flush freed; empty where the
    record has no reading."""
    reading, after = run.flushed, run.drained
    if reading is None or after is None:
        return []
    ev = _against_probe(reading.before, by_group(reading.gauges_before), "before the flush")
    ev += _against_probe(after, by_group(reading.gauges_after), "after the flush")
    return ev + _against_flush(reading.before, after, by_group(reading.gauges_before))


def _against_probe(probe: ProbeReport, read: dict, when: str) -> list[Evidence]:
    ev = []
    for group, g in probe.groups.items():
        for state, want in promised(g).items():
            got = read.get((group, state))
            if got is None or got != want:
                shown = "no series" if got is None else f"{got:g}"
                detail = f"{POOL_PAGES}{{group={group},state={state}}} {when}: {shown}, "
                ev.append(_evidence(group, detail + f"the probe counts {want}"))
    return ev


def _against_flush(before: ProbeReport, after: ProbeReport, read: dict) -> list[Evidence]:
    ev = []
    for group, g in before.groups.items():
        if group not in after.groups:
            continue
        device = after.groups[group].free - g.free
        host = g.by_owner.get("host", 0) - after.groups[group].by_owner.get("host", 0)
        for state, freed in (("evictable", device), ("host_evictable", host)):
            said = read.get((group, state))
            if said is not None and said != freed:
                detail = (
                    f"{POOL_PAGES}{{group={group},state={state}}} said {said:g} pages before "
                    f"the flush, and the flush freed {freed}"
                )
                ev.append(_evidence(group, detail))
    return ev


def _evidence(group: str, detail: str) -> Evidence:
    return Evidence(group=group, pages=(), detail=detail)
