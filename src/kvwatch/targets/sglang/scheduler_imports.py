"""What a release's own ``Scheduler`` needs imported, beyond its caches: ``PLAN``.

``release_import.load(V, plan=PLAN)`` loads a release whose ``Scheduler``
(``managers/scheduler.py``) and the modules it runs through are the wheel's
own, unchanged:

* ``REAL``: the scheduler, its output-processor / runtime-checker / DP
  mixins (``managers/`` before 0.5.10.post1, ``observability/`` after), its
  components (``managers/scheduler_components/``, 0.5.13+), the messages
  (``io_struct``), ``SamplingParams``, the real ``ServerArgs`` dataclass,
  ``DisaggregationMode`` (a stub makes every ``== DisaggregationMode.NULL``
  false), ``ParallelState`` (a stub makes every rank check false), the
  metrics collectors' and tracing modules it calls unconditionally, and
  ``sglang.utils`` (``TypeBasedDispatcher``);
* ``STUBBED``: the third-party packages the scheduler imports at its top
  (ZMQ, psutil, transformers, ...), stubs; ``zmq`` itself is a fixed module
  with a real ``ZMQError`` (the receive loop ends on it) and the socket kinds;
* ``UTILS``: helpers the scheduler takes from ``sglang.srt.utils``:
  ``raise_error_or_warn`` records what SGLang's own checks report
  (``OWN_REPORTS``) instead of raising, the rest answer as a single CPU rank;
* stubbed ``Scheduler*Mixin`` bases are plain empty classes (``plain_mixins``):
  with a stub base every attribute the scheduler reads but never set would be
  a falsy stub and take a branch SGLang never takes (``self.dllm_config``).

Invariant: nothing here runs a line of SGLang's scheduling; it only decides
which of the wheel's modules are imported as they ship.
"""

from __future__ import annotations

import functools
import logging
import re
import types
from typing import Any

from kvwatch.targets.sglang.release_import import ImportPlan
from kvwatch.targets.stand_ins import TOUCHED, StubModule

REAL = (
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.scheduler_output_processor_mixin",
    "sglang.srt.managers.scheduler_runtime_checker_mixin",
    "sglang.srt.managers.scheduler_dp_attn_mixin",
    "sglang.srt.managers.scheduler_metrics_mixin",  # before 0.5.10.post1
    "sglang.srt.managers.scheduler_components",  # 0.5.13+
    "sglang.srt.managers.io_struct",
    "sglang.srt.managers.overlap_utils",
    "sglang.srt.managers.scheduler_input_blocker",
    "sglang.srt.managers.scheduler_recv_skipper",
    "sglang.srt.managers.prefill_delayer",
    "sglang.srt.mem_cache.kv_cache_builder",  # 0.5.13+: builds pools' users and the tree
    "sglang.srt.sampling.sampling_params",
    "sglang.srt.server_args",
    "sglang.srt.speculative.spec_info",
    "sglang.srt.constants",
    "sglang.srt.disaggregation.utils",
    "sglang.srt.distributed.parallel_state_wrapper",
    "sglang.srt.observability.scheduler_metrics_mixin",  # 0.5.10.post1+
    "sglang.srt.observability.metrics_collector",
    "sglang.srt.observability.req_time_stats",
    "sglang.srt.observability.trace",
    "sglang.srt.metrics.collector",  # before 0.5.10.post1
    "sglang.srt.dllm.mixin.scheduler",
    "sglang.utils",
)
STUBBED = (
    *("zmq", "psutil", "setproctitle", "tqdm", "transformers", "requests", "pydantic"),
    *("fastapi", "uvicorn", "aiohttp", "prometheus_client", "tvm_ffi", "xgrammar"),
    *("outlines", "llguidance", "einops", "PIL", "openai", "partial_json_parser"),
    *("compressed_tensors", "numba", "IPython", "decord", "soundfile", "sentencepiece"),
    *("tiktoken", "blobfile", "interegular", "modelscope", "hf_transfer", "safetensors"),
    *("nvtx", "torch_memory_saver", "mooncake", "nixl", "triton_kernels", "flash_attn"),
    *("opentelemetry", "pynvml", "tabulate", "pandas", "scipy", "matplotlib", "grpc"),
    *("httpx", "uvloop", "dill", "cloudpickle", "yaml", "jsonschema", "datasets"),
)
MIXIN = re.compile(r"Scheduler\w*Mixin")
log = logging.getLogger("kvwatch.sglang")


class ZMQError(Exception):
    """``zmq.ZMQError``: a non-blocking receive on an empty socket raises it."""


ZMQ_KINDS = dict(PAIR=0, PUB=1, SUB=2, REQ=3, REP=4, DEALER=5, ROUTER=6, PULL=7, PUSH=8)
RECEIVING = (ZMQ_KINDS["PULL"], ZMQ_KINDS["DEALER"])  # the scheduler reads these sockets


def zmq_module() -> dict[str, types.ModuleType]:
    values = dict(ZMQ_KINDS, ZMQError=ZMQError, Again=ZMQError, NOBLOCK=1, POLLIN=1)
    return {"zmq": StubModule("zmq", values, package=True)}


OWN_REPORTS: list[str] = []  # what SGLang's own checks reported (raise_error_or_warn)


def raise_error_or_warn(obj: Any, strict: Any, counter_name: str, message: str, *_: Any) -> None:
    """SGLang's helper raises in strict mode and warns otherwise: here it records
    the message (``OWN_REPORTS``) and counts, as the warning path does."""
    OWN_REPORTS.append(message)
    setattr(obj, counter_name, getattr(obj, counter_name, 0) + 1)
    log.debug("sglang's own check: %s", message)


class DynamicGradMode:
    """``@DynamicGradMode()`` on the event loops: no autograd switch on the host."""

    def __init__(self, *_: Any, **__: Any) -> None:
        pass

    def __call__(self, fn: Any) -> Any:
        return fn


def _cpu_module(*_: Any, **__: Any) -> Any:
    import torch

    return torch.cpu


UTILS: dict[str, Any] = {
    "raise_error_or_warn": raise_error_or_warn,
    "DynamicGradMode": DynamicGradMode,
    "get_available_gpu_memory": lambda *a, **k: 0.0,
    "broadcast_pyobj": lambda data, *a, **k: data,  # one rank: what it has is everyone's
    "point_to_point_pyobj": lambda data, *a, **k: data,
    "set_random_seed": lambda *a, **k: None,
    "get_device_module": _cpu_module,
    "kill_itself_when_parent_died": lambda: None,
    "suppress_noisy_warnings": lambda: None,
    "get_exception_traceback": lambda: "",
    "is_in_ci": lambda: False,
    "get_colorful_logger": logging.getLogger,
    **dict.fromkeys(
        ("require_mlp_sync", "require_gathered_buffer", "require_mlp_tp_gather"),
        lambda *a, **k: False,
    ),
    "require_attn_tp_gather": lambda *a, **k: False,
}


class _PlainMixins:
    """Mixed into a stub module's class: its ``Scheduler*Mixin`` names are plain classes."""

    def __getattr__(self, attr: str) -> Any:
        if MIXIN.fullmatch(attr):
            value = type(attr, (), {"__module__": self.__name__})
            TOUCHED.add(f"{self.__name__}.{attr} (plain)")
            setattr(self, attr, value)
            return value
        return super().__getattr__(attr)


@functools.cache
def _plain(cls: type) -> type:
    return type(f"Plain{cls.__name__}", (_PlainMixins, cls), {})


def plain_mixins(module: types.ModuleType) -> types.ModuleType:
    module.__class__ = _plain(type(module))
    return module


PLAN = ImportPlan(
    real=REAL,
    stubbed=STUBBED,
    fixed=zmq_module,
    unfixed=("sglang.srt.server_args",),
    utils=UTILS,
    plain_mixins=plain_mixins,
)
