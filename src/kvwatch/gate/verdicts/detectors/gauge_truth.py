"""The engine's gauges tell the truth: each says what the probe counts, and the
evictable figures are what the flush then frees.

A dashboard, an autoscaler or an alert reads ``kvwatch_pool_pages`` (and the
tree, session, request and slot gauges) and believes it. Two promises are
checked where the record holds the gauges read around a probe of the idle
engine (at every turn barrier, and on both sides of the drain's flush:
``harness/flush_reading.py``; kvwatch's own server, white-box):

* each gauge series equals the probe of the same moment (read before and
  after the probe, and kept only when both reads agree), by its definition
  in ``promised`` (the pool states below);
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
from kvwatch.gate.verdicts.detectors.verdict import Evidence
from kvwatch.harness.run_record import RunRecord
from kvwatch.harness.scrape import parse_spec, selector
from kvwatch.instrumentation import names as n

POOL_PAGES = n.prom(n.POOL_PAGES)
# every gauge the engine exports from its stats, by its series name
GAUGES = tuple(n.prom(name) for name in n.ENGINE_GAUGES)


def pool_states(g: GroupReport) -> dict[str, int]:
    """What each state's ``kvwatch_pool_pages`` must say of a group the probe
    reports as ``g``."""
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


def promised(probe: ProbeReport) -> dict[str, float]:
    """Every gauge series the engine must export at the moment of ``probe``, by its
    selector (``name{label="v",...}``, labels sorted, as ``scrape`` reads them)."""
    s, out = probe.stats, {}

    def put(name: str, value: float, **labels: str) -> None:
        out[selector(n.prom(name), labels)] = value

    for group, g in s.groups.items():
        for state, value in pool_states(g).items():
            put(n.POOL_PAGES, value, group=group, family=g.family, state=state)
        put(n.POOL_CAPACITY, g.capacity, group=group, family=g.family)
        put(n.SESSION_PAGES, g.by_owner.get("session", 0), group=group)
    put(n.ROOT_REFS, s.root_refs.actual)
    put(n.ROOT_REFS_EXPECTED, s.root_refs.expected)
    put(n.TREE_NODES, s.tree.nodes)
    for group, value in s.tree.snapshots.items():
        put(n.TREE_SNAPSHOTS, value, group=group)
    for group, value in s.tree.interior_snapshots.items():
        put(n.TREE_INTERIOR_SNAPSHOTS, value, group=group)
    put(n.SESSIONS_LIVE, s.live_sessions)
    put(n.RECORD_BYTES, s.record_bytes)
    for state, value in s.queue._asdict().items():
        put(n.REQUESTS_LIVE, value, state=state)
    if s.slots is not None:
        put(n.SLOTS_FILLED, s.slots.filled)
        put(n.SLOT_ENTRIES, s.slots.entries)
    return out


def by_group(gauges: dict[str, float]) -> dict[tuple[str, str], float]:
    """The pool gauges read, by (group, state)."""
    out = {}
    for series, value in gauges.items():
        name, labels = parse_spec(series)
        if name == POOL_PAGES and "group" in labels and "state" in labels:
            out[labels["group"], labels["state"]] = value
    return out


def read(run: RunRecord) -> int:
    """How many probes the record holds gauges beside (barriers, the flush's two)."""
    barriers = sum(1 for t in run.turns if t.pool_gauges is not None and t.barrier is not None)
    return barriers + (2 if run.flushed is not None else 0)


def untrue_at_barriers(run: RunRecord) -> tuple[int, list[Evidence]] | None:
    """The first barrier whose gauges disagree with its probe, and how."""
    for turn in run.turns:
        if turn.pool_gauges is None or turn.barrier is None:
            continue
        if ev := _against_probe(turn.barrier, turn.pool_gauges, f"at turn {turn.turn}"):
            return turn.turn, ev
    return None


def untrue_at_flush(run: RunRecord) -> list[Evidence]:
    """Every gauge that disagrees with the probe around the drain's flush, and every
    evictable figure that disagrees with what the flush freed; empty where the
    record has no reading."""
    reading, after = run.flushed, run.drained
    if reading is None or after is None:
        return []
    ev = _against_probe(reading.before, reading.gauges_before, "before the flush")
    ev += _against_probe(after, reading.gauges_after, "after the flush")
    return ev + _against_flush(reading.before, after, by_group(reading.gauges_before))


def _against_probe(probe: ProbeReport, gauges: dict[str, float], when: str) -> list[Evidence]:
    """Each promised series missing or other than promised, and each series read of
    an engine gauge that the probe gives no reason for (a group it does not have)."""
    want, ev = promised(probe), []
    for series, value in want.items():
        got = gauges.get(series)
        if got != value:
            shown = "no series" if got is None else f"{got:g}"
            ev.append(_evidence(series, f"{series} {when}: {shown}, the probe counts {value:g}"))
    for series, got in gauges.items():
        name, _ = parse_spec(series)
        if series not in want and name in GAUGES:
            ev.append(_evidence(series, f"{series} {when}: {got:g}, for nothing the probe has"))
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
                ev.append(Evidence(group=group, pages=(), detail=detail))
    return ev


def _evidence(series: str, detail: str) -> Evidence:
    _, labels = parse_spec(series)
    return Evidence(group=labels.get("group"), pages=(), detail=detail)
