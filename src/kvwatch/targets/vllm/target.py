"""vLLM as a gate target, white-box: ``--engine vllm --model DIR``.

One vLLM server (``api_server.py``, from ``--vllm-python``) serves every
profile of the gate, with kvwatch's probe in its engine core
(``plugin.py`` -> ``core_probe.py``). Its records carry probes (the
audit of its block pool and the checks of ``checks.py``,
``probe.py``), registries (the KV managers' container sizes), gauges
and request counts, so ``allocator``, ``refcount``, ``tree``, ``quiescence``,
``requests`` and ``gauge-trend`` judge it; it has no heap sampler and no
cache-off replay. ``--vllm-version`` runs another release
(``release.py``). The
profiles that need only the OpenAI API run. ``--inject`` plants one of
kvwatch's vLLM bugs (``plugin.FAULTS``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx

from kvwatch.harness import outputs
from kvwatch.harness.locust_run import HANDOVER, run_turns
from kvwatch.harness.plan import GaugePreset, ProbeSpec, RunPlan
from kvwatch.harness.profiles import Profile, openai_only
from kvwatch.harness.progress import Progress
from kvwatch.harness.recorder import full_pools
from kvwatch.harness.run_record import RunRecord, Signal
from kvwatch.harness.target import RunSpec, Served, Target
from kvwatch.processes import ServerError
from kvwatch.targets.vllm.probe import probe_report

SOURCE = "kvwatch.targets.vllm.probe:VllmProbeSource.for_plan"


class VllmTarget(Target):
    name = "vllm"
    signals = frozenset({Signal.PROBES, Signal.REGISTRIES, Signal.GAUGES, Signal.REQUESTS})

    def __init__(
        self,
        out: Path,
        python: str,
        model: Path,
        gauges: GaugePreset,
        *,
        faults: tuple[str, ...] = (),
        args: tuple[str, ...] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        """``env``: added to vLLM's environment (a release's ``PYTHONPATH``)."""
        from kvwatch.targets.vllm.plugin import FAULTS

        if not (Path(model) / "config.json").is_file():
            raise ValueError(f"--engine vllm takes --model DIR, a model's directory: {model!r}")
        if len(faults) > 1 or not set(faults) <= set(FAULTS):
            raise ValueError(f"--engine vllm injects one fault of {', '.join(FAULTS)}")
        self.out, self.python, self.model, self.gauges = out, python, Path(model), gauges
        self.faults, self.args, self.env = tuple(faults), tuple(args), dict(env or {})
        self.server = None

    def profiles(self) -> Mapping[str, Profile]:
        """The profiles that speak only the OpenAI API."""
        return openai_only()

    @contextlib.contextmanager
    def started(self, progress: Progress) -> Iterator[None]:
        """One vLLM, with kvwatch's probe, for every profile."""
        from kvwatch.targets.vllm.api_server import VllmServer

        log = outputs.child(self.out, "servers", "vllm.log")
        progress.say(f"starting vLLM ({self.python}) with {self.model}; log in {log}")
        self.server = VllmServer(
            self.python,
            self.model,
            log,
            fault=self.faults[0] if self.faults else None,
            probe=True,
            served_name=self.model.name,
            extra=self.args,
            env=self.env,
        )
        try:
            yield
        finally:
            self.server.stop()
            self.server = None

    @contextlib.contextmanager
    def serving(self, profile: Profile, progress: Progress) -> Iterator[Served]:
        if self.server is None:
            raise ServerError("vLLM is not running")
        yield VllmServed(self, profile)


class VllmServed(Served):
    def __init__(self, target: VllmTarget, profile: Profile) -> None:
        self.target, self.profile, self.server = target, profile, target.server

    def exited(self) -> str | None:
        return self.server.exited()

    def run(self, spec: RunSpec) -> RunRecord:
        if gone := self.server.exited():
            return RunRecord(turns=(), error=f"not run: {gone}")
        if full := self.full():
            return RunRecord(turns=(), error=f"not run: {full}, left by the runs before")
        plan = RunPlan(
            profile=self.profile.name,
            concurrency=spec.concurrency,
            target=self.server.url,
            record=str(spec.where / HANDOVER),
            turns=spec.turns,
            warmup=spec.warmup,
            seed=spec.seed,
            metrics_url=self.server.metrics_url,
            source=ProbeSpec(
                factory=SOURCE,
                white_box=True,
                url=self.server.probe_url,
                flush_every_turn=self.profile.flush_every_turn,
            ),
            model=self.target.model.name,
            gauges=self.target.gauges,
        )
        run = run_turns(plan, spec, self.profile.user)
        if gone := self.server.exited():
            return RunRecord(turns=(), error=gone)  # a partial record is not judged
        return run

    def full(self) -> str:
        """Why no run can go on, when the pool vLLM shares between runs is already full
        before this one (an earlier run's leak filled it): each would wait out the turn
        timeout for pages that never come back. Empty when there is room."""
        try:
            answer = httpx.get(f"{self.server.probe_url}/audit", timeout=60)
            answer.raise_for_status()
        except httpx.HTTPError:
            return ""  # the run itself will say what is wrong
        probe = probe_report(answer.json())
        return full_pools(probe) if probe.live_requests == 0 else ""
