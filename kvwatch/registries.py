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
label set) in ``__bounded__``; the walk skips those. A
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

CONTAINERS = (dict, list, set, deque)
MAX_OBJECTS = 4000  # objects visited per walk; a bound, not a figure any engine reaches
PACKAGE = "kvwatch."


def _ours(obj: object) -> bool:
    module = getattr(type(obj), "__module__", "") or ""
    return module.startswith(PACKAGE) and not isinstance(obj, type)


def _fields(obj: object) -> list[tuple[str, object]]:
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


def registry_sizes(roots: Mapping[str, object]) -> dict[str, int]:
    """The length of every container reachable from ``roots``, by attribute path.

    Breadth-first over kvwatch objects; each object and each container is
    reported once, under the first path that reaches it.
    """
    sizes: dict[str, int] = {}
    seen: set[int] = set()
    queue: deque[tuple[str, object]] = deque(roots.items())
    while queue and len(seen) < MAX_OBJECTS:
        path, obj = queue.popleft()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, Counter):  # keys stay at zero: what it counts is the size
            sizes[path] = sum(v for v in obj.values() if v > 0)
        elif isinstance(obj, CONTAINERS):
            sizes[path] = len(obj)
            if isinstance(obj, dict) and obj and isinstance(next(iter(obj.values())), CONTAINERS):
                sizes[f"{path}[*]"] = sum(
                    len(v) for v in list(obj.values()) if isinstance(v, CONTAINERS)
                )
            queue.extend((f"{path}~{type(o).__name__}", o) for o in _callbacks(obj))
        elif _ours(obj):
            bounded = getattr(type(obj), "__bounded__", ())
            for name, value in _fields(obj):
                if name in bounded:
                    continue
                if isinstance(value, CONTAINERS) or _ours(value):
                    queue.append((f"{path}.{name}", value))
    return sizes


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
