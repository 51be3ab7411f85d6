"""A stand-in for ``sglang.srt.runtime_context``: the configuration SGLang's caches read.

From 0.5.16 SGLang's modules read their configuration through
``sglang.srt.runtime_context`` (``get_server_args()``, ``get_parallel()``;
from 0.5.22 also namespaced "config bags": ``get_memory().radix_eviction_policy``,
``get_exec().mamba.enable_mamba_extra_buffer``). The real module needs a
published ``ServerArgs`` and process groups; this one answers from three
layers, the first that has the field winning:

1. the run's own settings (``run_settings``: page size, spec decoding,
   chunked prefill, streaming sessions, one process's parallel ranks);
2. the release's declared defaults, read with ``ast`` from the wheel's
   ``sglang/srt/arg_groups/fields/*.py`` (each ``class X(msgspec.Struct)``
   with ``_NS_PATH = "exec.mamba"`` and ``field: T = default``);
3. ``None`` for anything else (noted in ``stand_ins.TOUCHED``).

Invariant: a value read here is the run's (layer 1) or the release's own
declared default; nothing is invented.
"""

from __future__ import annotations

import ast
import contextlib
import math
from pathlib import Path
from typing import Any, NamedTuple

from kvwatch.targets.stand_ins import TOUCHED, StubModule

_MISSING = object()
NAMESPACES = (
    "memory",
    "serving",
    "spec",
    "exec",
    "schedule",
    "disagg",
    "model",
    "device",
    "observability",
    "lora",
    "mm",
    "parallel",
    "platform",
    "flags",
    "forward",
    "resources",
)


def _literal_fields(cls: ast.ClassDef) -> dict[str, Any]:
    """``name: T = literal`` fields of a class body (computed defaults are left out)."""
    out = {}
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value:
            with contextlib.suppress(ValueError):  # a computed default: not claimed
                out[stmt.target.id] = ast.literal_eval(stmt.value)
    return out


def _namespace(cls: ast.ClassDef) -> str | None:
    for stmt in cls.body:
        targets = [getattr(t, "id", None) for t in getattr(stmt, "targets", ())]
        if isinstance(stmt, ast.Assign) and targets == ["_NS_PATH"]:
            return ast.literal_eval(stmt.value)
    return None


def declared_defaults(root: Path) -> dict[str, dict[str, Any]]:
    """``{"exec.mamba": {"mamba_track_interval": 256, ...}, ...}`` from the
    release's ``arg_groups/fields`` (empty for releases without it)."""
    folder = root / "sglang" / "srt" / "arg_groups" / "fields"
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.py")) if folder.is_dir() else ():
        for cls in ast.parse(path.read_text()).body:
            if isinstance(cls, ast.ClassDef) and (ns := _namespace(cls)):
                out.setdefault(ns, {}).update(_literal_fields(cls))
    return out


def class_defaults(path: Path, name: str) -> dict[str, Any]:
    """The literal field defaults class ``name`` (and its bases in the same file)
    declares in ``path``: what an incoming message (``TokenizedGenerateReqInput``,
    ``SessionParams``) carries when the sender leaves a field out."""
    if not path.is_file():
        return {}
    tree = ast.parse(path.read_text())
    classes = {c.name: c for c in tree.body if isinstance(c, ast.ClassDef)}
    out: dict[str, Any] = {}

    def visit(cls: ast.ClassDef) -> None:
        for base in cls.bases:
            if isinstance(base, ast.Name) and base.id in classes:
                visit(classes[base.id])
        out.update(_literal_fields(cls))

    if name in classes:
        visit(classes[name])
    return out


class Settings(NamedTuple):
    """``values[namespace][field]`` (``""``: fields read without a namespace, as
    ``get_server_args().x``) over the release's ``defaults``."""

    values: dict[str, dict[str, Any]]
    defaults: dict[str, dict[str, Any]]


class Bag:
    """One namespace (``get_exec()``), with its sub-namespaces (``.mamba``)."""

    def __init__(self, path: str, settings: Settings) -> None:
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_settings", settings)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        path, s = self._path, self._settings
        for layer in (s.values, s.defaults):
            value = layer.get(path, {}).get(name, _MISSING)
            if value is not _MISSING:
                return value
        sub = f"{path}.{name}" if path else name
        if any(ns == sub or ns.startswith(sub + ".") for ns in (*s.values, *s.defaults)):
            return Bag(sub, s)
        if not path:  # a flat read (get_server_args().x) of a namespaced field
            for layer in (s.values, s.defaults):
                for fields in layer.values():
                    if name in fields:
                        return fields[name]
        TOUCHED.add(f"runtime_context.{sub}")
        return None

    def __setattr__(self, name: str, value: Any) -> None:
        self._settings.values.setdefault(self._path, {})[name] = value

    def __contains__(self, name: str) -> bool:
        return getattr(self, name) is not None


class _Context:
    """``get_context()``: overrides land in the run's settings."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def override(self, source: str, **fields: Any) -> None:
        self.settings.values.setdefault("", {}).update(fields)

    def is_config_namespace_published(self, name: str) -> bool:
        return False  # as in SGLang's unit tests: no published server config


class Holder:
    """The settings of the run in progress (one at a time, as the real module)."""

    current = Settings(values={}, defaults={})


def _bag(ns: str):
    return lambda: Bag(ns, Holder.current)


def _mamba_cache_chunk_size() -> int:
    page = Bag("schedule", Holder.current).page_size or 1
    chunk = Bag("exec.mamba", Holder.current).mamba_chunk_size or 64
    return max(chunk, page)


def _checkpoint_grid(tree_page: int) -> int:
    return math.lcm(_mamba_cache_chunk_size(), tree_page)


def _track_grid(tree_page: int) -> int:
    interval = Bag("exec.mamba", Holder.current).mamba_track_interval or 1
    return math.lcm(_checkpoint_grid(tree_page), interval)


def module(name: str) -> StubModule:
    """The stand-in module, answering from ``Holder.current``."""
    values: dict[str, Any] = {f"get_{ns}": _bag(ns) for ns in NAMESPACES}
    values.update(
        get_server_args=_bag(""),
        get_context=lambda: _Context(Holder.current),
        attention_backends=lambda: ("torch_native", "torch_native"),
        mamba_cache_chunk_size=_mamba_cache_chunk_size,
        mamba_checkpoint_grid=_checkpoint_grid,
        mamba_track_grid=_track_grid,
        max_speculative_num_draft_tokens=lambda: _bag("spec")().speculative_num_draft_tokens,
    )
    return StubModule(name, values)


def run_settings(root: Path, config: Any) -> Settings:
    """The settings of one run (``config``: a ``shim_parts.ShimConfig``): what the
    run decides; every other field is the release's declared default."""
    spec, pools = config.spec, config.pools
    ranks = ("tp", "pp", "attn_tp", "attn_cp", "attn_dcp")  # one process: sizes 1, ranks 0
    parallel: dict[str, Any] = {f"{k}_size": 1 for k in ranks} | {f"{k}_rank": 0 for k in ranks}
    parallel |= {"dcp_enabled": False, "pp_max_micro_batch_size": config.max_running_requests}
    values: dict[str, dict[str, Any]] = {
        "schedule": {
            "page_size": pools.page_size,
            "chunked_prefill_size": config.chunked_prefill_size,
            "max_prefill_tokens": config.max_prefill_tokens,
        },
        "parallel": parallel,
        "spec": {
            "speculative_algorithm": "EAGLE" if spec else None,
            "speculative_num_steps": spec.num_steps if spec else None,
            "speculative_eagle_topk": spec.topk if spec else None,
            "speculative_num_draft_tokens": spec.num_draft_tokens if spec else None,
        },
        "serving": {"enable_streaming_session": config.streaming},
        "memory": {"enable_session_radix_cache": False},
        # not a decode server: SGLang resolves the retraction backup to cpu_tensor
        "disagg": {"disaggregation_decode_retraction_backup": "cpu_tensor"},
        "exec.kernel": {"attention_backend": "torch_native"},
        "model": {"context_length": pools.max_context_len},
    }
    return Settings(values=values, defaults=declared_defaults(root))
