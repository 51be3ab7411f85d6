"""Engine configs from JSON: a nested mapping of overrides applied to a config.

    {"cache": {"full_kv": {"capacity": 1024}, "mode": "slots"},
     "scheduler": {"chunk_size": 48, "spec": {"num_drafts": 6}}}

or from ``KEY=VALUE`` assignments (``assignment``), as ``kvwatch gate
--engine-set`` takes them: ``cache.full_kv.page_size=8``, ``scheduler.spec=null``.

Every key must name a field of the dataclass it lands in; a mapping under a
dataclass field (or under a field that is None and typed as one) recurses;
None switches off a field typed as optional (``X | None``).
The result is built with ``dataclasses.replace``, so each config's own
validation runs and a bad value raises ValueError with its message.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def apply_overrides(config: T, data: Mapping[str, Any], where: str = "") -> T:
    if not isinstance(data, Mapping):
        raise ValueError(f"config {where or 'root'} must be an object, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(config)}
    hints = typing.get_type_hints(type(config))
    changes = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else key
        if key not in fields:
            raise ValueError(f"unknown config field {path!r}; known: {', '.join(fields)}")
        current = getattr(config, key)
        if value is None and _optional(hints[key]):  # an optional part switched off
            changes[key] = None
            continue
        nested = current if dataclasses.is_dataclass(current) else _dataclass_in(hints[key])
        if isinstance(value, Mapping) and nested is not None:
            base = current if dataclasses.is_dataclass(current) else nested()
            changes[key] = apply_overrides(base, value, path)
        elif dataclasses.is_dataclass(current):
            raise ValueError(f"config {path!r} must be an object, got {value!r}")
        else:
            changes[key] = _scalar(path, current, value)
    try:
        return dataclasses.replace(config, **changes)
    except TypeError as exc:
        raise ValueError(f"config {where or 'root'}: {exc}") from None


def _optional(hint: Any) -> bool:
    return isinstance(hint, types.UnionType) and type(None) in typing.get_args(hint)


def assignment(text: str) -> dict:
    """``KEY=VALUE`` as the overrides it sets: a dotted key, a JSON value (a bare
    word is a string), e.g. ``cache.full_kv.page_size=8`` ->
    ``{"cache": {"full_kv": {"page_size": 8}}}``; ``scheduler.spec=null``
    switches an optional part off."""
    key, sep, raw = text.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(p.strip() for p in parts):
        raise ValueError(f"{text!r} is not KEY=VALUE (e.g. cache.full_kv.page_size=8)")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    for part in reversed(parts):
        value = {part.strip(): value}
    return value


def _dataclass_in(hint: Any) -> type | None:
    """The dataclass a field is typed as (``SpecConfig | None`` gives SpecConfig)."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    return next((t for t in options if dataclasses.is_dataclass(t)), None)


def _scalar(path: str, current: Any, value: Any) -> Any:
    if isinstance(current, bool) or isinstance(value, bool):
        if not isinstance(value, bool) or not isinstance(current, bool):
            raise ValueError(f"config {path!r} must be {type(current).__name__}, got {value!r}")
        return value
    if isinstance(current, int) and not isinstance(value, int):
        raise ValueError(f"config {path!r} must be an integer, got {value!r}")
    if isinstance(current, float) and not isinstance(value, (int, float)):
        raise ValueError(f"config {path!r} must be a number, got {value!r}")
    if isinstance(current, frozenset):
        if not isinstance(value, list):
            raise ValueError(f"config {path!r} must be a list, got {value!r}")
        return frozenset(value)
    return value
