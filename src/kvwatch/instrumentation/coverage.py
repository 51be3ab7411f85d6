"""The lifecycle state machines of a request, a session and a snapshot slot, as
data, and coverage: which transitions a run took and which it never took.

A leak hides on a transition no load ever takes, so a gate run says which
ones it took (``lifecycle.LifecycleCounter`` counts them in the server from
the engine's events). Transitions are ``"from -> to"``::

    request  new -> queued -> (waiting ->) prefilling -> decoding <-> verifying
                                   \\            \\            \\
                                    aborted      retracted -> recovering -> decoding
                                                 (decoding ->) paused -> recovering
                                                              ... -> finished | aborted
             any live stage -> failed (no pages for it even alone; listed,
             but no load can be sure to take them: not owed)
    session  new -> open -> running -> parked | cut -> running | rolled back
                                                     -> closed | timed out
    slot     empty -> prepared -> filled | aborted;  filled -> prepared (reused),
             restored, evicted (pressure | flush)

A slot lookup that finds an entry whose slot no longer holds its content
(``SlotMissed``) is not a transition of a correct engine: confirming a
snapshot erases the entries of the slot it reuses. It shows as unlisted.

A transition the events show that a machine does not list is kept under its
own name (``unlisted``), so a gap in the model is visible. ``MACHINES`` also
holds the combination and boundary machines of ``combos.py`` (a session turn
aborted at each stage, crossings on one path, session calls against a turn,
branch offsets within a page): coverage treats every machine alike. This
module imports nothing of the engine.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import NamedTuple

from kvwatch.instrumentation import combos

NEW = "new"


class Machine(NamedTuple):
    name: str
    states: tuple[str, ...]
    transitions: tuple[str, ...]  # "from -> to": a gate's load must take each
    # transitions a correct engine may take that no load can be sure to: listed (never
    # unlisted when seen, counted as taken), but not owed (never "never")
    also: tuple[str, ...] = ()


def _edges(*pairs: tuple[str, str]) -> tuple[str, ...]:
    return tuple(f"{a} -> {b}" for a, b in pairs)


_LIVE = (
    "queued",
    "waiting",
    "prefilling",
    "decoding",
    "verifying",
    "retracted",
    "paused",
    "recovering",
)
REQUEST = Machine(
    name="request",
    states=(NEW, *_LIVE, "finished", "aborted", "failed"),
    transitions=_edges(
        (NEW, "queued"),
        ("queued", "waiting"),  # behind a sharer that computes its prefix
        ("queued", "prefilling"),
        ("waiting", "prefilling"),
        ("prefilling", "decoding"),
        ("decoding", "verifying"),  # a step with drafts
        ("prefilling", "verifying"),  # a one-token prefill with drafts (a parked session's turn)
        ("recovering", "verifying"),
        ("verifying", "decoding"),
        ("prefilling", "retracted"),
        ("decoding", "retracted"),
        ("verifying", "retracted"),
        ("recovering", "retracted"),
        ("retracted", "recovering"),
        ("decoding", "paused"),  # let go without a commit, to be resumed
        ("paused", "recovering"),
        ("recovering", "decoding"),
        ("decoding", "finished"),
        *((s, "aborted") for s in _LIVE),  # an abort at each stage
    ),
    # a request that cannot go on even alone (its admission into an idle cache,
    # its readmission after a retraction or a pause, its lone chunk, its lone
    # decode step or its recovery found no pages), at any live stage: an error
    # to its client. They follow a failpoint, or a full pool, at a moment
    # nothing else can be unpinned, which no load can time; the failpoint machine owes the failures themselves
    also=_edges(*((s, "failed") for s in _LIVE)),
)

SESSION = Machine(
    name="session",
    states=(NEW, "open", "running", "parked", "cut", "rolled back", "closed", "timed out"),
    transitions=_edges(
        (NEW, "open"),
        ("open", "running"),
        ("running", "parked"),  # the turn finished; the session keeps its cache slot
        ("running", "cut"),  # the turn was aborted
        ("parked", "running"),
        ("cut", "running"),
        ("parked", "rolled back"),
        ("cut", "rolled back"),  # back to the last finished turn, the cut one's tokens gone
        ("rolled back", "running"),
        ("open", "closed"),
        ("parked", "closed"),
        ("cut", "closed"),
        ("rolled back", "closed"),
        ("parked", "timed out"),
        ("cut", "timed out"),
    ),
)

SLOT = Machine(
    name="slot",
    states=("empty", "prepared", "filled", "aborted", "restored", "missed", "evicted"),
    transitions=_edges(
        ("empty", "prepared"),
        ("filled", "prepared"),  # a filled slot handed out again
        ("prepared", "filled"),
        ("prepared", "aborted"),
        ("filled", "restored"),
        ("filled", "evicted (pressure)"),
    ),
    # the flush after the drain finds a filled slot only if the run's last stagings
    # went through: with the gate's failpoints on slot.stage, at c = 8, not every
    # run ends so (taken in two default gates of three); listed, not owed
    also=_edges(("filled", "evicted (flush)")),
)

# A state snapshot on the host tier: offloaded there when the request at its node was
# retracted, then loaded back for the recovery, or left as cache (the request was
# aborted while retracted, or its recovery failed) and taken back by pressure on the
# host pool or by a flush.
HOST_SNAPSHOT = Machine(
    name="host snapshot",
    states=("device", "host", "pruned", "evicted", "flushed"),
    transitions=_edges(
        ("device", "host"),
        ("host", "device"),
        ("host", "pruned"),  # the host pool ran short: cache taken back
        ("host", "flushed"),
    ),
    # a node evicted with its host snapshot (only once nothing on its path is cached
    # deeper), or a host snapshot superseded by a deeper one on its path: no load can
    # be sure to reach either; listed, not owed
    also=_edges(("host", "evicted"), ("host", "superseded")),
)

# The lifecycles, then the combination and boundary machines (combos.py).
MACHINES: Mapping[str, Machine] = {
    m.name: m
    for m in (REQUEST, SESSION, SLOT, HOST_SNAPSHOT, *(Machine(*data) for data in combos.MACHINES))
}


def coverage(taken: Mapping[str, Mapping[str, int]]) -> dict[str, dict]:
    """Per machine: the transitions it lists, which were taken (with counts),
    which never were, and transitions seen that it does not list."""
    out = {}
    for name, machine in MACHINES.items():
        seen, listed = taken.get(name, {}), (*machine.transitions, *machine.also)
        out[name] = {
            "taken": {t: seen[t] for t in listed if seen.get(t)},
            "never": [t for t in machine.transitions if not seen.get(t)],
            "unlisted": {t: n for t, n in seen.items() if t not in listed},
            "total": len(machine.transitions),
        }
    return out


def merge(*taken: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """Counts of several runs added up."""
    out: dict[str, Counter] = {}
    for t in taken:
        for machine, edges in t.items():
            out.setdefault(machine, Counter()).update(edges)
    return {m: dict(c) for m, c in out.items()}


def since(before: Mapping[str, Mapping[str, int]], after: Mapping[str, Mapping[str, int]]):
    """What ``after`` counted beyond ``before`` (two readings of one counter)."""
    out = {}
    for machine, edges in after.items():
        was = before.get(machine, {})
        out[machine] = {t: n - was.get(t, 0) for t, n in edges.items() if n > was.get(t, 0)}
    return out
