"""A release's own ``Scheduler``, built by its own ``__init__`` on a CPU host.

``build(release, config, clock, model)`` (the release active, loaded with
``scheduler_imports.PLAN``) returns the scheduler and its worker:

1. the release's ``ServerArgs`` dataclass with its declared defaults and
   the run's settings (``scheduler_host.server_args``), published with its
   own ``set_global_server_args_for_scheduler``;
2. names the scheduler's modules imported from stubbed ones and must call
   for data get a host answer (``_host_names``): the model config, the
   release's own ``compute_dp_attention_world_info`` compiled from its
   source, in-memory ZMQ sockets, no shared-memory features, no load
   snapshots, our model worker (``stand_in_worker``);
3. every SGLang module that reads ``time`` reads the run's virtual clock;
4. ``CpuScheduler``, a subclass of the release's ``Scheduler`` that replaces
   only the ``init_*`` steps that need a GPU, a tokenizer, peers or a
   watchdog thread, wires the sockets, and records (rather than raises) what
   SGLang's own memory check reports (0.5.4-0.5.10 raise ``ValueError``;
   later releases call ``raise_error_or_warn``). Hooks of stubbed mixins the
   loop calls are no-ops only where the release defines none; handlers of
   control messages whose mixins are stubbed (weights, LoRA, profiling) raise.

What runs as shipped: ``__init__`` (policy, caches through the release's own
builder, sessions, chunked prefill, ratios, timeouts), the event loop,
``process_input_requests``, ``get_next_batch_to_run``, ``PrefillAdder``,
``update_running_batch`` / retraction, ``process_batch_result_*``,
``abort_request``, waiting timeouts, the queued-requests limit and priority.

Invariant: ``CpuScheduler`` overrides no method that admits, schedules,
retracts, aborts, caches or frees; ``SGLANG_TEST_RETRACT`` is set as SGLang
reads it (the scheduler module's constants) and nothing else of its
behaviour is changed.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from types import SimpleNamespace
from typing import Any

from kvwatch.targets.sglang import runtime_host, scheduler_host, scheduler_imports
from kvwatch.targets.sglang.loop_parts import LoopConfig
from kvwatch.targets.sglang.release_import import Release
from kvwatch.targets.sglang.stand_in_worker import StandInWorker, TokenModel

SCHEDULER = "sglang.srt.managers.scheduler"
# hooks the loop calls whose mixins are stubbed in some releases: no-ops where undefined
HOOKS = (
    *("log_prefill_stats", "log_decode_stats", "report_prefill_stats", "report_decode_stats"),
    *("log_batch_result_stats", "update_device_timer", "_profile_batch_predicate"),
    *("reset_device_timer_window", "_publish_kv_events", "maybe_sleep_on_idle"),
    *("reset_metrics", "init_profiler", "init_diffusion_llm", "init_mamba_backend"),
    *("init_soft_watchdog", "init_pdmux"),
)
DISPATCHED = re.compile(r"\(\s*\w+,\s*self\.(\w+),?\s*\)")  # TypeBasedDispatcher entries


def settings(config: LoopConfig) -> dict[str, Any]:
    """The server arguments of one run (those the release declares are set)."""
    return dict(
        model_path="stand-in",
        tokenizer_path="stand-in",
        skip_tokenizer_init=True,
        device="cpu",
        page_size=config.pools.page_size,
        disable_overlap_schedule=not config.overlap,
        chunked_prefill_size=config.chunked_prefill_size or -1,
        max_prefill_tokens=config.max_prefill_tokens,
        max_running_requests=config.max_running_requests,
        max_queued_requests=config.max_queued_requests,
        enable_priority_scheduling=config.priority_scheduling,
        schedule_policy="fcfs",
        enable_streaming_session=config.streaming,
        attention_backend="torch_native",
        context_length=config.pools.max_context_len,
        random_seed=0,
        watchdog_timeout=1e9,
        soft_watchdog_timeout=None,
        stream_interval=1,
        enable_metrics=False,
        disaggregation_mode="null",
        sleep_on_idle=False,
        pp_max_micro_batch_size=None,
        **dict.fromkeys(("tp_size", "pp_size", "dp_size", "ep_size", "attn_cp_size"), 1),
        moe_dp_size=1,
    )


def _server_args(release: Release, config: LoopConfig) -> Any:
    module = importlib.import_module("sglang.srt.server_args")
    args = scheduler_host.server_args(module.ServerArgs, **settings(config))
    model = scheduler_host.model_config(config.pools.max_context_len)
    object.__setattr__(args, "get_model_config", lambda *a, **k: model)
    if "FLA_CHUNK_SIZE" in vars(module) and not isinstance(module.FLA_CHUNK_SIZE, int):
        # imported from a stubbed kernel module (0.5.11+): the wheel's own literal
        fla = "sglang/srt/layers/attention/fla/chunk_delta_h.py"
        module.FLA_CHUNK_SIZE = scheduler_host.release_literal(release.root, fla, "CHUNK_SIZE")
    module.set_global_server_args_for_scheduler(args)
    return args


def _sockets(ctx: Any, kind: int, *_: Any, **__: Any) -> Any:
    if kind in scheduler_imports.RECEIVING:
        return scheduler_host.InQueue()
    return scheduler_host.OutSink()


def _host_names(release: Release, config: LoopConfig, worker: Any) -> dict[str, Any]:
    """What the scheduler's modules imported from stubbed ones, answered."""
    model = scheduler_host.model_config(config.pools.max_context_len)
    world = scheduler_host.release_function(
        release.root, "sglang/srt/layers/dp_attention.py", "compute_dp_attention_world_info"
    )
    return {
        "ModelConfig": SimpleNamespace(from_server_args=lambda *a, **k: model),
        "compute_dp_attention_world_info": world,
        "get_zmq_socket": _sockets,
        "unwrap_shm_features": lambda req: req,
        "has_shm_features": lambda *a, **k: False,
        "create_load_snapshot_writer": lambda *a, **k: None,
        "TpModelWorker": worker,
        "TpModelWorkerClient": worker,
    }


def _patch(names: dict[str, Any], clock: scheduler_host.Clock) -> None:
    """Bind ``names`` in the scheduler's modules that import them, and the virtual
    clock in every SGLang module that reads ``time``."""
    clock_module = clock.module()
    for name, module in list(sys.modules.items()):
        if not name.startswith("sglang.") or module is None:
            continue
        found = vars(module)
        if getattr(found.get("time"), "__name__", None) == "time":
            module.time = clock_module
        if name.startswith("sglang.srt.managers."):
            for attr, value in names.items():
                if attr in found:
                    setattr(module, attr, value)


def _retract_every(module: Any, every: int | None) -> None:
    """``SGLANG_TEST_RETRACT`` / ``_INTERVAL``, which scheduler.py reads at import."""
    module.TEST_RETRACT = bool(every)
    module.TEST_RETRACT_INTERVAL = every or 3
    if hasattr(module, "TEST_RETRACT_NO_PREFILL_BS"):
        module.TEST_RETRACT_NO_PREFILL_BS = 1 << 30


def build(release: Release, config: LoopConfig, clock: Any, model: TokenModel) -> tuple:
    """The release's ``Scheduler`` for ``config`` and its worker (release active)."""
    workers: list[StandInWorker] = []
    runtime = runtime_host.applies(release.root)  # 0.5.16+: runtime_context
    args = (
        runtime_host.server_args(release, settings(config))
        if runtime
        else _server_args(release, config)
    )

    def worker(*_: Any, **__: Any) -> StandInWorker:
        workers.append(StandInWorker(release, config.pools, model, args))
        if runtime:
            runtime_host.fit_worker(workers[-1], release, config, args)
        return workers[-1]

    tp_worker = importlib.import_module("sglang.srt.managers.tp_worker")
    tp_worker.TpModelWorker = tp_worker.TpModelWorkerClient = worker
    module = importlib.import_module(SCHEDULER)
    names = _host_names(release, config, worker)
    if runtime:
        names.update(runtime_host.host_names(release, config))
        runtime_host.model_family(config)
    _patch(names, clock)
    _retract_every(module, config.retract_every)
    cls = scheduler_class(release, module.Scheduler)
    offered = dict(
        server_args=args,
        port_args=scheduler_host.PortArgsStandIn(nccl_port=0),
        gpu_id=0,
        tp_rank=0,
        moe_ep_rank=0,
        pp_rank=0,
        attn_cp_rank=0,
        moe_dp_rank=0,
        dp_rank=None,
        dp_balance_meta=None,
    )
    params = inspect.signature(module.Scheduler.__init__).parameters
    scheduler = cls(**{k: v for k, v in offered.items() if k in params})
    _patch({}, clock)  # modules the constructor imported lazily read the clock too
    return scheduler, workers[0]


def scheduler_class(release: Release, base: type) -> type:
    """``CpuScheduler``: ``base`` with the host's init steps (module docstring)."""
    cls = type("CpuScheduler", (_HostSteps, base), {"__module__": __name__})
    for name in HOOKS:
        if not hasattr(cls, name):
            setattr(cls, name, _noop(name))
    source = (release.root / "sglang/srt/managers/scheduler.py").read_text()
    for name in sorted(set(DISPATCHED.findall(source))):
        if not hasattr(cls, name):
            setattr(cls, name, _unsupported(name))
    return cls


def _noop(name: str) -> Any:
    def noop(self: Any, *_: Any, **__: Any) -> None:
        return None

    noop.__name__ = name
    return noop


def _unsupported(name: str) -> Any:
    def unsupported(self: Any, *_: Any, **__: Any) -> None:
        raise NotImplementedError(f"{name}: its mixin is a stand-in on this host")

    unsupported.__name__ = name
    return unsupported


class _NoRegion:
    def __enter__(self) -> _NoRegion:
        return self

    def __exit__(self, *_: Any) -> bool:
        return False


class _HostSteps:
    """The ``init_*`` steps a CPU host replaces, first in ``CpuScheduler``'s MRO."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.dllm_config = None  # read before init_diffusion_llm in some releases
        super().__init__(*args, **kwargs)

    def init_sockets(self, *args: Any, **kwargs: Any) -> None:  # 0.5.4-0.5.5
        super().init_sockets(*args, **kwargs)
        self._wire()

    def init_ipc_channels(self, *args: Any, **kwargs: Any) -> None:  # 0.5.9+
        super().init_ipc_channels(*args, **kwargs)
        self._wire()

    def _wire(self) -> None:
        channels = getattr(self, "ipc_channels", None) or self  # 0.5.13+: ipc_channels
        self.kvwatch_inbox = channels.recv_from_tokenizer
        self.kvwatch_outboxes = (
            channels.send_to_tokenizer.socket,
            channels.send_to_detokenizer.socket,
        )

    def check_memory(self, *args: Any, **kwargs: Any) -> Any:
        """SGLang's own idle check (0.5.4-0.5.10 raise ``ValueError``): recorded."""
        try:
            return super().check_memory(*args, **kwargs)
        except ValueError as exc:
            scheduler_imports.OWN_REPORTS.append(str(exc))
            return None

    def init_tokenizer(self) -> None:
        self.is_generation = True
        self.tokenizer = scheduler_host.TokenizerStandIn()
        self.processor = None
        self._mm_processor = None

    def init_moe_gemm_config(self) -> None:
        self.require_mlp_sync = False

    def init_watch_dog_memory_saver_input_blocker(self) -> None:
        self.watchdog = None
        self.memory_saver_adapter = SimpleNamespace(region=lambda *a, **k: _NoRegion())
        self.offload_tags = set()
        self.recv_skipper = None
        self.input_blocker = None
