"""The probe contract: what ``Engine.probe()`` and ``GET /debug/probe`` report.

The engine produces these records, the server sends them as JSON, and the
recorder, the detectors, the soak and the report read them back, typed. This
module imports nothing from the engine (or anything else of kvwatch), so a
consumer that talks to a remote engine never loads torch.

The JSON shape is the stable one in ``docs/contracts.md``: a probe is flat
(the stats' fields, then ``findings`` and ``bounds``), and
``ProbeReport.from_json(report.to_json()) == report`` for every report.

A probe's ``root_refs`` are the audit's: the root's actual ref count against
what the live holders imply, recomputed from them.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, NamedTuple


class FindingKind(StrEnum):
    """The stable vocabulary of audit findings (detectors and CI match on it)."""

    ORPHAN = "orphan"  # allocated, but no live holder holds it
    DOUBLE_OWNED = "double_owned"  # held twice, or held by someone other than its tag says
    FREE_AND_OWNED = "free_and_owned"  # on the free stack while tagged or held
    REF_MISMATCH = "ref_mismatch"  # a ref count differs from what live holders imply
    TREE = "tree"  # a structure or counter invariant of the tree is broken
    SLOT_TABLE = "slot_table"  # the slot cache's entries disagree with its slots
    # an event listener raised: the engine isolated it and went on, so its
    # telemetry (metrics, spans, lifecycle counts) missed what it was told
    LISTENER = "listener"
    # a container outgrew the bound its class declares (``__bounded__``, found by the
    # server's registry walk): per-request or per-session state kept in a place
    # declared to hold only a few entries
    REGISTRY = "registry"
    # a request still running steps after its client hung up: nothing aborted it
    ABANDONED = "abandoned"
    # a session unused past its idle timeout, and a margin, still open: the idle
    # timeout never closed it (``--session-idle-timeout``)
    OVERDUE = "overdue"
    # a running request that holds pages and has work left was passed over by a
    # step that had budget to spare (the scheduler's liveness)
    STARVED = "starved"


# who is wrong about a page's owner: the allocator detector's findings
OWNERSHIP = frozenset({FindingKind.ORPHAN, FindingKind.DOUBLE_OWNED, FindingKind.FREE_AND_OWNED})
MAX_PAGES = 32  # a finding keeps the first page ids only; its detail says how many


SEVERE = "error"  # a broken invariant the detectors judge: the gate fails on it
# a broken invariant the engine's own maintainers hold harmless today: reported with
# the run (summary.json's ``notices``), never counted as a pass, but no detector
# fails on it: the user decides (a CI script reads ``notices``)
NOTICE = "notice"
SEVERITIES = (SEVERE, NOTICE)


class Finding(NamedTuple):
    kind: FindingKind
    group: str | None  # None: not about one pool group
    pages: tuple[int, ...]
    detail: str
    # what makes it the same finding in a later probe where its detail also
    # carries counts that move (an audit's rule and the requests it names);
    # empty: the kind, group, pages and detail do
    key: str = ""
    severity: str = SEVERE  # SEVERE or NOTICE

    @property
    def identity(self) -> tuple:
        """Equal for the same broken state seen by two probes (``gate``: a finding
        already in a run's baseline probe is not that run's doing)."""
        return (self.kind, self.group, self.pages, self.key or self.detail)

    def to_json(self) -> dict:
        out = {
            "kind": str(self.kind),
            "group": self.group,
            "pages": list(self.pages),
            "detail": self.detail,
        }
        if self.key:
            out["key"] = self.key
        if self.severity != SEVERE:
            out["severity"] = self.severity
        return out

    @classmethod
    def from_json(cls, data: dict) -> Finding:
        return cls(
            kind=FindingKind(data["kind"]),
            group=data["group"],
            pages=tuple(data["pages"]),
            detail=data["detail"],
            key=data.get("key", ""),
            severity=data.get("severity", SEVERE),
        )


def finding(
    kind: FindingKind,
    group: str | None,
    pages: list[int],
    detail: str,
    key: str = "",
    severity: str = SEVERE,
) -> Finding:
    return Finding(
        kind=kind,
        group=group,
        pages=tuple(pages[:MAX_PAGES]),
        detail=detail,
        key=key,
        severity=severity,
    )


class GroupReport(NamedTuple):
    """One pool group's pages."""

    family: str  # history or state
    capacity: int
    free: int
    # tree, request, session, slot; host: pages in the host tier; host_evictable: those of
    # them no retracted request will recover from (cache)
    by_owner: dict[str, int]
    evictable: int  # pages eviction, pruning or a flush may take back (tree, idle slots)
    host_capacity: int

    @property
    def used(self) -> int:
        return self.capacity - self.free


class TreeReport(NamedTuple):
    nodes: int
    snapshots: dict[str, int]  # nodes holding state, per state group
    host_snapshots: int
    # superseded snapshots (a deeper one on the same unbranched path): what
    # superseded-snapshot release should keep near zero once nobody runs (seed 000)
    interior_snapshots: dict[str, int]
    # tokens the tree's full pages cover: cache that may outlive every
    # conversation (evictable, bounded by the pool)
    tokens: int = 0


class SlotReport(NamedTuple):
    """The ``slots`` backend's table: filled slots, entries and the next slot handed out."""

    slots: int
    filled: int
    entries: int
    next_slot: int
    lengths: tuple[int, ...]  # tokens held, per slot (0: empty)


class QueueReport(NamedTuple):
    waiting: int
    running: int
    retracted: int
    paused: int


class RootRefs(NamedTuple):
    actual: int
    expected: int


class Bound(NamedTuple):
    """The usage one group's live holders justify (``exceeded``: they do not)."""

    group: str
    pinned: int  # pages this bound covers that nothing can take back
    limit: int  # the most the live holders justify
    shared: int  # state pages of snapshots several holders pin (not bounded here)
    holders: int

    @property
    def exceeded(self) -> bool:
        return self.pinned > self.limit


class EngineStats(NamedTuple):
    """The cheap part of a probe: no audit, no bounds. Gauges poll this."""

    step: int
    live_requests: int
    live_sessions: int
    groups: dict[str, GroupReport]
    root_refs: RootRefs  # in stats: one expected per holder with a lock
    tree: TreeReport
    queue: QueueReport
    record_bytes: int  # routed-expert blobs retained by session records
    slots: SlotReport | None = None  # only in slots mode
    sessions_closed: int = 0  # sessions closed since the engine started (a count, not live)

    def to_json(self) -> dict:
        return {
            "step": self.step,
            "live_requests": self.live_requests,
            "live_sessions": self.live_sessions,
            "groups": {name: g._asdict() for name, g in self.groups.items()},
            "root_refs": self.root_refs._asdict(),
            "tree": self.tree._asdict(),
            "queue": self.queue._asdict(),
            "record_bytes": self.record_bytes,
            "sessions_closed": self.sessions_closed,
            "slots": {**self.slots._asdict(), "lengths": list(self.slots.lengths)}
            if self.slots is not None
            else None,
        }

    @classmethod
    def from_json(cls, data: dict) -> EngineStats:
        slots = data.get("slots")
        return cls(
            step=data["step"],
            live_requests=data["live_requests"],
            live_sessions=data["live_sessions"],
            groups={name: GroupReport(**g) for name, g in data["groups"].items()},
            root_refs=RootRefs(**data["root_refs"]),
            tree=TreeReport(**data["tree"]),
            queue=QueueReport(**data["queue"]),
            record_bytes=data["record_bytes"],
            sessions_closed=data.get("sessions_closed", 0),
            slots=SlotReport(**{**slots, "lengths": tuple(slots["lengths"])}) if slots else None,
        )


class ProbeReport(NamedTuple):
    """The engine at a step boundary: its stats, the audit's findings and root refs,
    and the bound live holders justify in each group."""

    stats: EngineStats
    findings: tuple[Finding, ...]
    bounds: dict[str, Bound]
    # container sizes by attribute path (``kvwatch.instrumentation.registries``); a server's
    # probe fills them in, an engine's own probe leaves them empty
    registries: Mapping[str, int] = {}

    @property
    def clean(self) -> bool:
        return not self.findings

    @property
    def step(self) -> int:
        return self.stats.step

    @property
    def live_requests(self) -> int:
        return self.stats.live_requests

    @property
    def live_sessions(self) -> int:
        return self.stats.live_sessions

    @property
    def groups(self) -> dict[str, GroupReport]:
        return self.stats.groups

    @property
    def root_refs(self) -> RootRefs:
        return self.stats.root_refs

    @property
    def tree(self) -> TreeReport:
        return self.stats.tree

    @property
    def queue(self) -> QueueReport:
        return self.stats.queue

    @property
    def record_bytes(self) -> int:
        return self.stats.record_bytes

    @property
    def slots(self) -> SlotReport | None:
        return self.stats.slots

    def exceeded(self) -> list[Bound]:
        return [b for b in self.bounds.values() if b.exceeded]

    def to_json(self) -> dict[str, Any]:
        return {
            **self.stats.to_json(),
            "findings": [f.to_json() for f in self.findings],
            "bounds": {
                name: {**b._asdict(), "exceeded": b.exceeded} for name, b in self.bounds.items()
            },
            "registries": dict(self.registries),
        }

    @classmethod
    def from_json(cls, data: dict) -> ProbeReport:
        bounds = {
            name: Bound(**{k: v for k, v in b.items() if k != "exceeded"})
            for name, b in data.get("bounds", {}).items()
        }
        findings = tuple(Finding.from_json(f) for f in data.get("findings", ()))
        registries = {str(k): int(v) for k, v in data.get("registries", {}).items()}
        return cls(EngineStats.from_json(data), findings, bounds, registries)
