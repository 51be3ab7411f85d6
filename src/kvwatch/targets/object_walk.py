"""Registry sizes for an engine run in process: every container its objects hold.

kvwatch's ``quiescence`` detector compares, before a run and once it has
drained (sessions closed, cache flushed), the length of every container the
engine holds (``instrumentation/registries.py`` walks kvwatch's own engine).
This is the same walk over another engine's objects (``sglang/registry_walk.py``,
``lightllm/object_sizes.py`` name the roots and their engine's ``WalkRules``):

* from the roots, follow attributes (``__dict__`` and filled ``__slots__``)
  of objects whose class is defined in the engine's package
  (``WalkRules.package``); report every ``dict``, ``list``, ``set`` and
  ``deque`` reached, by the first attribute path that reaches it
  (``tree_cache.session.slots``), and with ``WalkRules.sums``, for a dict of
  containers, also the sum of their lengths (``path[*]``);
* never walk into a container's elements: tree nodes, requests and free
  lists' entries are contents, not registries; nor into the attributes
  named in ``WalkRules.skipped``;
* a container the engine bounds on purpose (``WalkRules.bound`` gives its
  bound) is left out of the sizes and reported (``Walk.breaches``) only
  above its bound.

Invariant: reading only; a walk visits at most ``WalkRules.max_objects`` objects.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from kvwatch.instrumentation.registries import CONTAINERS, object_fields


def unbounded(obj: object, name: str) -> int | None:
    return None


class WalkRules(NamedTuple):
    package: str  # "sglang.": the objects whose attributes are followed
    max_objects: int
    sums: bool = False  # path[*] for a dict of containers
    skipped: tuple[str, ...] = ()  # attribute names never followed nor reported
    bound: Callable[[object, str], int | None] = unbounded  # (object, attribute) -> its bound


class Walk(NamedTuple):
    sizes: dict[str, int]  # every registry by path (bounded ones left out)
    breaches: tuple[str, ...]  # bounded containers over their bound


def _engine_object(obj: object, package: str) -> bool:
    module = getattr(type(obj), "__module__", "") or ""
    return module.startswith(package) and not isinstance(obj, type)


def _size(path: str, obj: Any, sizes: dict[str, int], sums: bool) -> None:
    sizes[path] = len(obj)
    if sums and isinstance(obj, dict) and obj and isinstance(next(iter(obj.values())), CONTAINERS):
        sizes[f"{path}[*]"] = sum(len(v) for v in obj.values() if isinstance(v, CONTAINERS))


def _breach(path: str, obj: object, name: str, value: object, bound: int) -> str | None:
    if isinstance(value, CONTAINERS) and len(value) > bound:
        return (
            f"{path}.{name} holds {len(value)} entries, above the {bound} "
            f"{type(obj).__name__} bounds it to"
        )
    return None


def walk(roots: dict[str, object], rules: WalkRules) -> Walk:
    """The length of every container reachable from ``roots`` through the engine's
    objects, and the bounded ones over their bound."""
    sizes: dict[str, int] = {}
    breaches: list[str] = []
    seen: set[int] = set()
    queue: deque[tuple[str, object]] = deque(roots.items())
    while queue and len(seen) < rules.max_objects:
        path, obj = queue.popleft()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, CONTAINERS):
            _size(path, obj, sizes, rules.sums)
            continue
        if not _engine_object(obj, rules.package):
            continue
        for name, value in object_fields(obj):
            if name in rules.skipped:
                continue
            if (bound := rules.bound(obj, name)) is not None:
                if breach := _breach(path, obj, name, value, bound):
                    breaches.append(breach)
            elif isinstance(value, CONTAINERS) or _engine_object(value, rules.package):
                queue.append((f"{path}.{name}", value))
    return Walk(sizes=sizes, breaches=tuple(breaches))
