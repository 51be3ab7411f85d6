"""Registry sizes: every container kvwatch's own objects hold, found by walking them.

Per-request and per-session state ends up in many places: the engine's
request table, the scheduler's queues, the cache's holders, a server's map of
streams, a listener's open spans. Each must be back at its size before a run
once the run has drained, its sessions are closed and the cache is flushed.
Naming them by hand would miss the one a new bug adds, so they are found by
walking::

    roots ──attr──> kvwatch object ──attr──> kvwatch object ...
                         │                        │
                       dict / list / set / deque  (reported: len, by path)

The walk follows attributes of objects whose class is defined in kvwatch, and
callbacks held in containers (a bound method leads to the listener that
subscribed it), never the elements of a container otherwise: a tree's nodes,
a session's tokens and a pool's arrays are contents, not registries. A class
names the containers it bounds on purpose (the last N closed ids, one sum per
label set) in ``__bounded__``, a mapping from attribute to the most entries it
may hold. Those are not compared before and after a run (they may fill up to
their bound), but the bound is checked, not trusted: every walk reports a
bounded container that holds more, or a deque whose ``maxlen`` does not keep
it within its bound (``Walk.breaches``). A
container is named by the first attribute path that reaches it
(``worker.engine._scheduler.waiting``), the same on every call; for a dict whose
values are containers, ``path[*]`` is the sum of their lengths (listeners
per event type, say); a ``Counter`` counts what it counts (the sum of its
positive values), since its keys may stay at zero.
"""

from __future__ import annotations

import sys
import types
from collections import Counter, deque
from collections.abc import Mapping
from typing import NamedTuple

CONTAINERS = (dict, list, set, deque)
MAX_OBJECTS = 4000  # objects visited per walk; a bound, not a figure any engine reaches
PACKAGE = "kvwatch."


def _ours(obj: object) -> bool:
    module = getattr(type(obj), "__module__", "") or ""
    return module.startswith(PACKAGE) and not isinstance(obj, type)


def object_fields(obj: object) -> list[tuple[str, object]]:
    """An object's attributes: its ``__dict__`` and its filled ``__slots__``."""
    out = list(getattr(obj, "__dict__", {}).items())
    for cls in type(obj).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if name != "__dict__" and hasattr(obj, name):
                out.append((name, getattr(obj, name)))
    return out


def _callbacks(container) -> list[object]:
    """The objects behind bound methods a container holds (one level down for dicts)."""
    items = container.values() if isinstance(container, dict) else container
    out = []
    for item in list(items):
        inner = item if isinstance(item, CONTAINERS) else (item,)
        for x in list(inner.values() if isinstance(inner, dict) else inner):
            if isinstance(x, types.MethodType) and _ours(x.__self__):
                out.append(x.__self__)
    return out


class Breach(NamedTuple):
    """A container that outgrew the bound its class declares in ``__bounded__``."""

    path: str
    size: int
    bound: int
    detail: str


class Walk(NamedTuple):
    sizes: dict[str, int]  # every registry by path (bounded ones left out)
    breaches: tuple[Breach, ...]  # bounded containers over their bound


def _size(obj: object) -> int:
    if isinstance(obj, Counter):  # keys stay at zero: what it counts is the size
        return sum(v for v in obj.values() if v > 0)
    return len(obj)


def _breach(path: str, value: object, bound: int) -> Breach | None:
    """Whether a declared-bounded container is over its bound, or could grow past it."""
    if not isinstance(value, CONTAINERS):
        return None
    size = len(value)  # entries, for a Counter too: what it may hold, not what it counts
    if size > bound:
        return Breach(
            path=path,
            size=size,
            bound=bound,
            detail=f"{path} holds {size} entries, above the {bound} its class declares in __bounded__",
        )
    if isinstance(value, deque) and (value.maxlen is None or value.maxlen > bound):
        keeps = "any number" if value.maxlen is None else f"up to {value.maxlen}"
        return Breach(
            path=path,
            size=size,
            bound=bound,
            detail=f"{path} is declared to hold at most {bound} entries but its deque keeps {keeps}",
        )
    return None


def registry_sizes(roots: Mapping[str, object]) -> dict[str, int]:
    """The length of every container reachable from ``roots``, by attribute path."""
    return walk(roots).sizes


def walk(roots: Mapping[str, object]) -> Walk:
    """Every container reachable from ``roots``, by attribute path, and the bounded
    ones over their bound.

    Breadth-first over kvwatch objects; each object and each container is
    reported once, under the first path that reaches it.
    """
    sizes: dict[str, int] = {}
    breaches: list[Breach] = []
    seen: set[int] = set()
    queue: deque[tuple[str, object]] = deque(roots.items())
    while queue and len(seen) < MAX_OBJECTS:
        path, obj = queue.popleft()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, CONTAINERS):
            sizes[path] = _size(obj)
            if isinstance(obj, dict) and obj and isinstance(next(iter(obj.values())), CONTAINERS):
                sizes[f"{path}[*]"] = sum(
                    len(v) for v in list(obj.values()) if isinstance(v, CONTAINERS)
                )
            queue.extend((f"{path}~{type(o).__name__}", o) for o in _callbacks(obj))
        elif _ours(obj):
            bounded = getattr(type(obj), "__bounded__", {})
            if not isinstance(bounded, Mapping):
                raise TypeError(f"{type(obj).__qualname__}.__bounded__ maps names to bounds")
            for name, value in object_fields(obj):
                if name in bounded:
                    if (breach := _breach(f"{path}.{name}", value, bounded[name])) is not None:
                        breaches.append(breach)
                    continue
                if isinstance(value, CONTAINERS) or _ours(value):
                    queue.append((f"{path}.{name}", value))
    return Walk(sizes=sizes, breaches=tuple(breaches))


def module_roots() -> dict[str, object]:
    """The containers and kvwatch objects held by loaded kvwatch modules' globals
    (a module-level map is a registry too), by ``module.name``."""
    out = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith(PACKAGE) or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if not attr.startswith("__") and (isinstance(value, CONTAINERS) or _ours(value)):
                out[f"{name}.{attr}"] = value
    return out
