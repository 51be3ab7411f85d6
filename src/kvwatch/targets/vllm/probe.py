"""White-box vLLM as a probe source: the engine core's audit, read as a kvwatch probe.

The recorder (``instrumentation/recorder.py``) takes a probe at every
barrier, while turns run, and before and after the run, and flushes the
cache once the run has drained. Against vLLM started with kvwatch's probe
(``core_probe.py``), ``VllmProbeSource`` answers those calls from
``GET /audit`` and ``POST /flush`` on the engine core's loopback port, and
the gauges and the liveness check from vLLM's OpenAI server as the
black-box source does::

    recorder.probe()  -> GET  probe/audit  -> probe_report(answer) -> ProbeReport
    recorder.flush()  -> POST probe/flush
    recorder.gauges() -> GET  server/metrics

``probe_report`` maps the audit onto the probe contract (``contracts.py``),
so the allocator, refcount and tree detectors judge vLLM as they judge
kvwatch's engine: one history group, ``vllm.kv``, whose used blocks are the
referenced ones (cached blocks no request holds count as free, as vLLM's
usage gauge counts them), and each audit finding as the finding kind whose
detector owns that invariant. The answer's ``checks`` (``checks.py``:
hashes against tokens, per-step scratch, liveness) join the findings the same
way, and its ``registries`` (the KV managers' container sizes) are the
probe's, for the quiescence detector. Nothing here imports vLLM.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from kvwatch.contracts import ProbeReport
from kvwatch.harness.run_record import HeapSample
from kvwatch.harness.sources import TIMEOUT, HttpSource
from kvwatch.targets.vllm.audit_report import GROUP, probe_report

__all__ = ["GROUP", "VllmProbeSource", "probe_report"]

if TYPE_CHECKING:
    from kvwatch.harness.plan import RunPlan


class VllmProbeSource(HttpSource):
    """vLLM's OpenAI server at ``target`` for gauges, its engine core's probe at
    ``probe_url`` for probes and flushes. No heap samples, no finished-request
    log, no per-step watch: those are kvwatch server endpoints."""

    def __init__(
        self,
        target: str,
        probe_url: str,
        *,
        metrics_url: str | None = None,
        metrics_settle: float = 0.1,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        kwargs = {"sleep": sleep} if sleep is not None else {}
        super().__init__(
            target, white_box=True, metrics_url=metrics_url, metrics_settle=metrics_settle, **kwargs
        )
        self.probe_url = probe_url.rstrip("/")

    @classmethod
    def for_plan(cls, plan: RunPlan, *, sleep: Callable[[float], None] | None = None):
        """vLLM's server at ``plan.target``, its engine core's probe at ``plan.source.url``."""
        return cls(
            plan.target,
            plan.source.url,
            metrics_url=plan.metrics_url,
            metrics_settle=plan.metrics_settle,
            sleep=sleep,
        )

    def probe(self) -> ProbeReport:
        resp = self.http.get(f"{self.probe_url}/audit", timeout=TIMEOUT)
        resp.raise_for_status()
        return probe_report(resp.json())

    def flush(self) -> bool:
        """True once no request is live: the prefix cache was reset, or what it
        could not drop is held by nobody live (leaked: the drain rule says so)."""
        resp = self.http.post(f"{self.probe_url}/flush", timeout=TIMEOUT)
        resp.raise_for_status()
        answer = resp.json()
        return answer["flushed"] or answer["live_requests"] == 0

    def answering(self) -> None:
        self.http.get(f"{self.target}/v1/models", timeout=TIMEOUT).raise_for_status()

    def watch(self) -> None:
        pass

    def finished(self) -> dict:
        return {"requests": [], "finished": 0, "dropped": 0}

    def latched(self) -> list[ProbeReport]:
        return []

    def session_open(self, session_id: str) -> bool:
        return False  # vLLM has no sessions API

    def census(self) -> dict[str, int]:
        raise NotImplementedError("vLLM's probe has no census")

    def heap_start(self) -> None:
        raise NotImplementedError("vLLM's probe has no heap sampler")

    heap_mark = heap_stop = heap_start

    def heap_sample(self, sites: int, top: int) -> HeapSample:
        raise NotImplementedError("vLLM's probe has no heap sampler")
