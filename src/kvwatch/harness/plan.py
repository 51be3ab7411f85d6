"""What one load run does, as a frozen value the gate writes and Locust reads.

The gate writes a ``RunPlan`` as JSON and starts Locust with
``--kvwatch-plan FILE``; the master (or the local runner) and every worker
read the same file, so a distributed run needs nothing else passed around.

The target under test fills ``source`` (a ``ProbeSpec``): which probe source
the barrier action builds (a factory named ``module:attribute``, so the
recorder never branches on what it records), where its probes are, and what
the recorder may ask of it (per-step watching, heap samples, replays, a flush
at every barrier). ``test_controls`` says whether users may send kvwatch's
test controls (scripted retractions), which only kvwatch's own server takes.

With ``soak`` set (``kvwatch gate --soak``) there is no barrier and no
recorder: users run episodes of ``turns`` turns back to back until Locust's
run time is up, and ``record`` receives the HTTP status counts instead.

``GaugePreset`` names the Prometheus series a black-box run reads:

* ``usage``: trended at turn barriers, per live conversation (gauge-trend);
* ``busy``: their sum is 0 when the engine is idle (the drain at a barrier);
* ``drain``: back at their starting value once the run has ended;
* ``settled``: back at their value at the end of the warm-up (the number of
  series on the page, ``scrape.SERIES``: label sets that appear with the
  first requests are not a leak, one per request or session is);
* ``truth``: white-box only, read on both sides of the drain's flush beside
  the probe (``flush_reading.py``): each must say what the probe counts.

A series is ``name`` or ``name{label="value",...}``; samples matching it are
kept apart by their remaining labels.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from kvwatch import MODEL_NAME
from kvwatch.harness.scrape import SERIES
from kvwatch.instrumentation import names as n

if TYPE_CHECKING:
    from kvwatch.harness.recorder import ProbeSource


class GaugePreset(NamedTuple):
    name: str
    usage: tuple[str, ...]
    busy: tuple[str, ...] = ()
    drain: tuple[str, ...] = ()
    # drain series whose label sets fill in during the first turns (the number of
    # series itself): back at their value at the end of the warm-up, not the start
    settled: tuple[str, ...] = ()
    # pool gauges read on both sides of the drain's flush, against the probe's count
    # (white-box targets whose probe counts the same pages: ``flush_reading.py``)
    truth: tuple[str, ...] = ()
    # counters read before and after a run, against the engine's transitions
    counters: tuple[str, ...] = ()


_PAGES = n.prom(n.POOL_PAGES)

PRESETS = {
    "kvwatch": GaugePreset(
        name="kvwatch",
        usage=(
            n.prom(n.TREE_INTERIOR_SNAPSHOTS),
            _PAGES + '{family="state",state="pinned_session"}',
            _PAGES + '{state="host"}',
            SERIES,
        ),
        busy=(n.prom(n.REQUESTS_LIVE),),
        counters=(
            n.prom(n.RETRACTIONS),
            n.prom(n.ABORTS),
            n.prom(n.REQUESTS_FINISHED),
            n.prom(n.REQUEST_DURATION) + "_count",
            n.prom(n.TOKENS_GENERATED),
            n.prom(n.PREFIX_QUERIED),
            n.prom(n.PREFIX_HIT),
            n.prom(n.PREFILL_COMPUTED),
            n.prom(n.EVICTIONS),
            # every bucket of the latency histograms, against the clients' timings
            *(n.prom(h) + "_bucket" for h in n.SECONDS),
        ),
        drain=(
            _PAGES + '{state="pinned_request"}',
            _PAGES + '{state="pinned_session"}',
            _PAGES + '{state="host"}',
        ),
        settled=(SERIES,),
        truth=tuple(n.prom(name) for name in n.ENGINE_GAUGES),
    ),
    "vllm": GaugePreset(
        name="vllm",
        usage=("vllm:kv_cache_usage_perc",),
        busy=("vllm:num_requests_running", "vllm:num_requests_waiting"),
        drain=("vllm:kv_cache_usage_perc",),
    ),
    "sglang": GaugePreset(
        name="sglang",
        usage=("sglang:token_usage", "sglang:swa_token_usage", "sglang:mamba_usage"),
        busy=("sglang:num_running_reqs", "sglang:num_queue_reqs"),
        drain=("sglang:token_usage", "sglang:swa_token_usage", "sglang:mamba_usage"),
    ),
}


def preset(name: str, extra_usage: tuple[str, ...] = ()) -> GaugePreset:
    if name not in PRESETS:
        raise ValueError(f"unknown gauge preset {name!r}; presets are {', '.join(PRESETS)}")
    base = PRESETS[name]
    return base._replace(usage=base.usage + tuple(extra_usage))


BLACK_BOX = "kvwatch.harness.sources:HttpSource.for_plan"


@dataclass(frozen=True, kw_only=True)
class ProbeSpec:
    """Where a run's probes come from and what the recorder may ask of them."""

    factory: str = BLACK_BOX  # "module:attribute", called as factory(plan, sleep=...)
    white_box: bool = False  # probes and a flush exist (else only gauges are read)
    url: str | None = None  # the probe endpoint, where it is not the target itself
    token: str | None = None  # bearer token for the probe endpoints
    watch: bool = False  # the engine probes after every step and keeps findings
    heap: bool = False  # heap samples at barriers
    census: bool = False  # a census of live objects at the warm-up's end and once drained
    replays: bool = False  # collect finished comparable requests for the replay
    flush_every_turn: bool = False  # flush the cache at every barrier


@dataclass(frozen=True, kw_only=True)
class RunPlan:
    profile: str
    concurrency: int
    target: str  # the server's base URL
    record: str  # where the recorder hands the run over (JSON)
    turns: int = 6
    warmup: int = 2
    seed: int = 0
    metrics_url: str | None = None
    source: ProbeSpec = field(default_factory=ProbeSpec)
    test_controls: bool = False  # the server takes kvwatch's test controls
    sample_every: float = 0.1  # seconds between probes while a turn runs (0: barriers only)
    drain_timeout: float = 120.0
    turn_timeout: float = 180.0  # no barrier completes for this long: the run broke
    # seconds to wait before a scrape, past a server's caching of its gauges (kvwatch
    # serve reads its engine afresh at every scrape: 0)
    metrics_settle: float = 0.1
    model: str = MODEL_NAME
    soak: bool = False  # free-running episodes, no barrier (see above)
    gauges: GaugePreset = field(default_factory=lambda: PRESETS["kvwatch"])

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def load(cls, path: str | Path) -> RunPlan:
        data = json.loads(Path(path).read_text())
        # to_json writes the preset as a list, in field order (a NamedTuple is a tuple)
        named = zip(GaugePreset._fields, data["gauges"], strict=False)
        data["gauges"] = GaugePreset(
            **{field: tuple(v) if isinstance(v, list) else v for field, v in named}
        )
        data["source"] = ProbeSpec(**data.get("source", {}))
        return cls(**data)


def probe_source(plan: RunPlan, sleep: Callable[[float], None]) -> ProbeSource:
    """The probe source ``plan.source`` names, built for ``plan``."""
    module, _, attribute = plan.source.factory.partition(":")
    factory = importlib.import_module(module)
    for part in attribute.split("."):
        factory = getattr(factory, part)
    return factory(plan, sleep=sleep)
