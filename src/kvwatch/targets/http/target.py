"""Any OpenAI-compatible server as a gate target, black-box: ``--target URL --metrics-url URL``.

Nothing is started, injected, probed or replayed: the profiles that need only
the OpenAI API run against the server, and what its records carry is the
request counts and the gauges of its Prometheus page (a ``GaugePreset``:
kvwatch's, vLLM's or SGLang's names, plus any ``--gauge``). So ``requests``
and ``gauge-trend`` judge it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from kvwatch import MODEL_NAME
from kvwatch.harness.locust_run import HANDOVER, run_turns
from kvwatch.harness.plan import GaugePreset, ProbeSpec, RunPlan
from kvwatch.harness.profiles import PROFILES, Profile, openai_only
from kvwatch.harness.progress import Progress
from kvwatch.harness.run_record import RunRecord, Signal
from kvwatch.harness.target import RunSpec, Served, Target


class HttpTarget(Target):
    name = "http"
    signals = frozenset({Signal.GAUGES, Signal.REQUESTS})

    def __init__(
        self, url: str, metrics_url: str, gauges: GaugePreset, *, model: str = MODEL_NAME
    ) -> None:
        self.url, self.metrics_url, self.gauges, self.model = url, metrics_url, gauges, model

    def profiles(self) -> Mapping[str, Profile]:
        """The profiles that speak only the OpenAI API."""
        return openai_only()

    def unknown_profile(self, name: str) -> str:
        if name in PROFILES:
            return (
                f"--profile {name} needs kvwatch's session API, which --target cannot "
                f"reach; a --target runs {', '.join(self.profiles())}"
            )
        return super().unknown_profile(name)

    @contextlib.contextmanager
    def serving(self, profile: Profile, progress: Progress) -> Iterator[Served]:
        yield HttpServed(self, profile)


class HttpServed(Served):
    def __init__(self, target: HttpTarget, profile: Profile) -> None:
        self.target, self.profile = target, profile

    def run(self, spec: RunSpec) -> RunRecord:
        target = self.target
        plan = RunPlan(
            profile=self.profile.name,
            concurrency=spec.concurrency,
            target=target.url,
            record=str(spec.where / HANDOVER),
            turns=spec.turns,
            warmup=spec.warmup,
            seed=spec.seed,
            metrics_url=target.metrics_url,
            source=ProbeSpec(flush_every_turn=self.profile.flush_every_turn),
            model=target.model,
            gauges=target.gauges,
        )
        return run_turns(plan, spec, self.profile.user)
