"""Registry sizes for SGLang: every container its cache, session and pool objects hold.

kvwatch's ``quiescence`` detector compares, before a run and once it has
drained (sessions closed, cache flushed), the length of every container the
engine holds (``instrumentation/registries.py`` walks kvwatch's own engine). This is
the same walk over SGLang's objects, by the same rules:

* start from the shim's SGLang objects (``roots``): the tree cache (and the
  cache under a session wrapper, and the ``StreamingSession`` it owns), the
  session controller, the request-to-token pool, the KV allocator (with its
  sub-allocators), the mamba pool and slot allocator;
* follow attributes (``__dict__`` and filled ``__slots__``) of objects whose
  class is defined in an ``sglang.`` module; report every ``dict``, ``list``,
  ``set`` and ``deque`` reached, by the first attribute path that reaches it
  (``tree_cache.session.slots``), and for a dict of containers also the sum
  of their lengths (``path[*]``);
* never walk into a container's elements: tree nodes, a session's requests
  and a pool's free lists are contents, not registries; nor report an
  allocator's free group (``FREE_GROUPS``): frees held back between
  ``free_group_begin`` and ``free_group_end``, whose list, before 0.5.22,
  keeps the last group's (already freed) pages until the next begin;
* a container SGLang bounds on purpose is named in ``BOUNDED`` with the
  module constant that bounds it (``UnifiedSessionRefTracker._closed_session_ids``,
  the last ``_CLOSED_SESSION_TOMBSTONE_LIMIT`` closed session ids): it is
  left out of the sizes and reported (``Walk.breaches``) only above its bound.

Invariant: reading only; a walk visits at most ``MAX_OBJECTS`` objects.
"""

from __future__ import annotations

import sys
from collections import deque
from typing import Any, NamedTuple

from kvwatch.instrumentation.registries import CONTAINERS, object_fields

MAX_OBJECTS = 4000
PACKAGE = "sglang."
# (class, attribute) -> the constant in the class's module that bounds it
BOUNDED = {("UnifiedSessionRefTracker", "_closed_session_ids"): "_CLOSED_SESSION_TOMBSTONE_LIMIT"}
FREE_GROUPS = ("free_group", "swa_free_group")


class Walk(NamedTuple):
    sizes: dict[str, int]  # every registry by path (bounded ones left out)
    breaches: tuple[str, ...]  # bounded containers over their bound


def _bound(obj: object, name: str) -> int | None:
    const = BOUNDED.get((type(obj).__name__, name))
    module = sys.modules.get(type(obj).__module__)
    return getattr(module, const, None) if const and module is not None else None


def _sglang_object(obj: object) -> bool:
    module = getattr(type(obj), "__module__", "") or ""
    return module.startswith(PACKAGE) and not isinstance(obj, type)


def _size(path: str, obj: Any, sizes: dict[str, int]) -> None:
    sizes[path] = len(obj)
    if isinstance(obj, dict) and obj and isinstance(next(iter(obj.values())), CONTAINERS):
        sizes[f"{path}[*]"] = sum(len(v) for v in obj.values() if isinstance(v, CONTAINERS))


def _breach(path: str, obj: object, name: str, value: object, bound: int) -> str | None:
    if isinstance(value, CONTAINERS) and len(value) > bound:
        return (
            f"{path}.{name} holds {len(value)} entries, above the {bound} "
            f"{type(obj).__name__} bounds it to"
        )
    return None


def walk(roots: dict[str, object]) -> Walk:
    """The length of every container reachable from ``roots`` through SGLang
    objects, and the bounded ones over their bound."""
    sizes: dict[str, int] = {}
    breaches: list[str] = []
    seen: set[int] = set()
    queue: deque[tuple[str, object]] = deque(roots.items())
    while queue and len(seen) < MAX_OBJECTS:
        path, obj = queue.popleft()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, CONTAINERS):
            _size(path, obj, sizes)
            continue
        if not _sglang_object(obj):
            continue
        for name, value in object_fields(obj):
            if name in FREE_GROUPS:
                continue
            if (bound := _bound(obj, name)) is not None:
                if breach := _breach(path, obj, name, value, bound):
                    breaches.append(breach)
            elif isinstance(value, CONTAINERS) or _sglang_object(value):
                queue.append((f"{path}.{name}", value))
    return Walk(sizes=sizes, breaches=tuple(breaches))


def roots(shim: Any) -> dict[str, object]:
    """Where a walk over one shim's SGLang objects starts."""
    cache = shim.tree_cache
    return {
        "tree_cache": cache,
        "tree_cache.inner": getattr(cache, "__dict__", {}).get("inner"),
        "sessions": shim.sessions,
        "req_to_token_pool": shim.pools.req_to_token_pool,
        "allocator": shim.pools.allocator,
    }
