"""An engine-core audit answer (``GET /audit``'s shape) as kvwatch's ``ProbeReport``.

``probe_report`` maps the audit onto the probe contract (``contracts.py``),
so the allocator, refcount and tree detectors judge vLLM as they judge
kvwatch's engine: one history group, ``vllm.kv``, whose used blocks are the
referenced ones (cached blocks no request holds count as free, as vLLM's
usage gauge counts them), and each audit finding as the finding kind whose
detector owns that invariant. The answer's ``checks`` (``checks.py``) join
the findings the same way, and its ``registries`` (the KV managers' container
sizes) are the probe's, for the quiescence detector.

It imports only the contracts and the audit's rule table, so it runs on
either side: in the gate's process (``probe.py``, ``scheduler_target.py``)
and in vLLM's own Python, where the history tier's driver process builds its
reports (``history_core.CoreProbe``).
"""

from __future__ import annotations

from kvwatch.contracts import (
    EngineStats,
    GroupReport,
    ProbeReport,
    QueueReport,
    RootRefs,
    TreeReport,
    finding,
)
from kvwatch.targets.vllm.manager_audit import KINDS

GROUP = "vllm.kv"


def probe_report(answer: dict) -> ProbeReport:
    """A ``GET /audit`` answer as a probe: one group, the audit's findings, no bounds."""
    audit = answer["audit"]
    capacity = audit["blocks_total"] - audit.get("pools", 1)  # the null blocks are no one's
    used = audit["blocks_referenced"]
    group = GroupReport(
        family="history",
        capacity=capacity,
        free=capacity - used,
        by_owner={"request": used},
        evictable=0,
        host_capacity=0,
    )
    found = tuple(
        finding(KINDS[f["rule"]], GROUP, list(f["blocks"]), _detail(f), key=_key(f))
        for f in (*audit["findings"], *answer.get("checks", ()))
    )
    stats = EngineStats(
        step=answer["step"],
        live_requests=audit["live_requests"],
        live_sessions=0,
        groups={GROUP: group},
        root_refs=RootRefs(0, 0),
        tree=TreeReport(
            nodes=audit["cached_hashes"], snapshots={}, host_snapshots=0, interior_snapshots={}
        ),
        queue=QueueReport(
            waiting=answer.get("waiting", 0),
            running=answer.get("running", 0),
            retracted=0,
            paused=0,
        ),
        record_bytes=0,
    )
    return ProbeReport(
        stats=stats, findings=found, bounds={}, registries=answer.get("registries", {})
    )


def _key(f: dict) -> str:
    """What makes it the same finding in a later probe: its rule and subject (the
    request an orphan is, ...); empty where its detail says it."""
    return f"{f['rule']}: {f['subject']}" if f.get("subject") else ""


def _detail(f: dict) -> str:
    """The audit's sentence, with the requests and the hash it names."""
    parts = [f"{f['rule']}: {f['detail']}"]
    if f.get("requests"):
        parts.append(f"requests {', '.join(f['requests'])}")
    if f.get("hash") and f["hash"] not in f["detail"]:
        parts.append(f"hash {f['hash']}")
    if f.get("pool"):
        parts.append(f"pool {f['pool']}")
    return "; ".join(parts)
