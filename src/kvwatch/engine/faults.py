"""The fault registry: every bug class kvwatch can re-introduce on demand.

A fault is off unless named in a config, by ``--inject NAME`` or in the
``KVWATCH_FAULTS`` environment variable (comma separated). Each one switches a
branch in the real code path back to the buggy behaviour of its seed report
(the README's table of seeds names each one); there is no fake counter anywhere.

The code that a fault touches checks membership directly, so a reader can grep
for the fault name and land on the line that carries the bug::

    if Fault.INTERIOR_SNAPSHOT_LEAK not in self.faults:
        self._release_superseded(holder)
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

ENV_VAR = "KVWATCH_FAULTS"


class Fault(StrEnum):
    INTERIOR_SNAPSHOT_LEAK = "interior-snapshot-leak"
    SNAPSHOT_RELEASE_IGNORES_HOST_REFS = "snapshot-release-ignores-host-refs"
    HISTORY_ONLY_ANCHOR = "history-only-anchor"
    ROOT_REF_LEAK_ON_MISS = "root-ref-leak-on-miss"
    ROOT_IN_EVICT_SET = "root-in-evict-set"
    ABORT_STATE_BUFFER_LEAK = "abort-state-buffer-leak"
    SPEC_OVERALLOC_LEAK = "spec-overalloc-leak"
    SESSION_TAIL_LEAK = "session-tail-leak"
    SESSION_TAIL_UNALIGNED_FREE = "session-tail-unaligned-free"
    SESSION_BLOB_RETENTION = "session-blob-retention"
    STALE_SLOT_ENTRY = "stale-slot-entry"
    SESSION_KEEPS_UNRUN_TURN = "session-keeps-unrun-turn"
    PREFIX_MATCH_FIRST_PAGE_ONLY = "prefix-match-first-page-only"
    EVICT_PARENT_UNANNOUNCED = "evict-parent-unannounced"
    ABORTED_HOLDER_PARKED = "aborted-holder-parked"


@dataclass(frozen=True)
class FaultInfo:
    name: Fault
    seed: str
    layer: str
    summary: str

    def as_dict(self) -> dict[str, str]:
        return {
            "name": str(self.name),
            "seed": self.seed,
            "layer": self.layer,
            "summary": self.summary,
        }


REGISTRY: Mapping[Fault, FaultInfo] = {
    info.name: info
    for info in (
        FaultInfo(
            name=Fault.INTERIOR_SNAPSHOT_LEAK,
            seed="000",
            layer="cache.commit",
            summary="superseded interior continuation snapshots on a locked path are never released",
        ),
        FaultInfo(
            name=Fault.SNAPSHOT_RELEASE_IGNORES_HOST_REFS,
            seed="000",
            layer="cache.commit",
            summary="the superseded-snapshot release checks device refs only, so a retracted "
            "request's recovery snapshot is dropped",
        ),
        FaultInfo(
            name=Fault.HISTORY_ONLY_ANCHOR,
            seed="000",
            layer="cache.commit",
            summary="adoption fails on a history-only node, so commit stops there and the "
            "request keeps its pages and snapshots until release",
        ),
        FaultInfo(
            name=Fault.ROOT_REF_LEAK_ON_MISS,
            seed="002",
            layer="cache.match",
            summary="a miss or a trim-to-empty keeps the root ref taken on descent",
        ),
        FaultInfo(
            name=Fault.ROOT_IN_EVICT_SET,
            seed="002",
            layer="cache.radix",
            summary="the root enters the eviction set when the tree empties",
        ),
        FaultInfo(
            name=Fault.ABORT_STATE_BUFFER_LEAK,
            seed="002",
            layer="cache.release",
            summary="state snapshots a request took but had not handed to the tree are not "
            "freed when it is aborted or paused",
        ),
        FaultInfo(
            name=Fault.SPEC_OVERALLOC_LEAK,
            seed="001",
            layer="scheduler",
            summary="after a speculative verify, the slots of rejected drafts are not freed",
        ),
        FaultInfo(
            name=Fault.SESSION_TAIL_LEAK,
            seed="001",
            layer="cache.sessions",
            summary="resuming a session does not free [prefix_len, kv_allocated_len): the new "
            "turn's pages replace the tail's in the slot and the old ones are orphaned",
        ),
        FaultInfo(
            name=Fault.SESSION_TAIL_UNALIGNED_FREE,
            seed="001",
            layer="cache.sessions",
            summary="the tail free is not page-aligned, so the partial page that still holds "
            "live tokens goes back to the free stack",
        ),
        FaultInfo(
            name=Fault.SESSION_BLOB_RETENTION,
            seed="003",
            layer="records",
            summary="every session record keeps its routed-expert blob, so retained memory is "
            "O(turns x prefix)",
        ),
        FaultInfo(
            name=Fault.STALE_SLOT_ENTRY,
            seed="004",
            layer="cache.slots",
            summary="confirming a snapshot into a reused slot leaves the entries that still "
            "point at it, and restore trusts an entry without checking the slot's "
            "contents, so KV from another conversation is restored",
        ),
        FaultInfo(
            name=Fault.SESSION_KEEPS_UNRUN_TURN,
            seed="001",
            layer="records",
            summary="a session turn aborted or failed before it was ever admitted stays in the "
            "session: the next turn is computed over a message its client withdrew",
        ),
        FaultInfo(
            name=Fault.PREFIX_MATCH_FIRST_PAGE_ONLY,
            seed="004",
            layer="cache.radix",
            summary="a lookup takes a whole cached node after comparing only its first page, so "
            "a prompt that parts from the node later reuses KV of another conversation",
        ),
        FaultInfo(
            name=Fault.EVICT_PARENT_UNANNOUNCED,
            seed="004",
            layer="cache.radix",
            summary="a flush tells listeners of the leaves it evicts but not of the parents "
            "that become leaves and go in the same call: the index events still name pages "
            "the tree gave back",
        ),
        FaultInfo(
            name=Fault.ABORTED_HOLDER_PARKED,
            seed="002",
            layer="cache",
            summary="an aborted request's holder is parked like a session's slot instead of "
            "released: its path stays locked and its pages held after its request ended, "
            "until pressure drops the slot",
        ),
    )
}


def parse_faults(names: Iterable[str]) -> frozenset[Fault]:
    """Turn fault names into a set, rejecting unknown names with the list of known ones."""
    faults: set[Fault] = set()
    for raw in names:
        name = raw.strip()
        if not name:
            continue
        try:
            faults.add(Fault(name))
        except ValueError:
            known = ", ".join(sorted(f.value for f in Fault))
            raise ValueError(f"unknown fault {name!r}; known faults: {known}") from None
    return frozenset(faults)


def faults_from_env(environ: Mapping[str, str] = os.environ) -> frozenset[Fault]:
    return parse_faults(environ.get(ENV_VAR, "").split(","))
