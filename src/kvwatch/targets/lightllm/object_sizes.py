"""Registry sizes for LightLLM: every container its cache, pool and infer-context objects hold.

kvwatch's ``quiescence`` detector compares, before a run and once it has
drained and its cache was flushed, the length of every container the engine
holds. This walks LightLLM's objects by the rules kvwatch's own walk
(``instrumentation/registries.py``) uses:

* start from the tree cache, the memory manager, the request manager, the
  small-page state buffers and ``g_infer_context`` (its
  ``requests_mapping``, ``infer_req_ids``, ...);
* follow attributes (``__dict__`` and filled ``__slots__``) of objects whose
  class is defined in a ``lightllm.`` module; report every ``dict``,
  ``list``, ``set`` and ``deque`` reached, by the first attribute path that
  reaches it (``radix.root_node.children``);
* never walk into a container's elements: tree nodes, requests and free
  lists' entries are contents, not registries.

kvwatch's stand-ins (the request records, the IO buffer) are not walked:
they are the router's, which is not there.

Invariant: reading only; a walk visits at most ``MAX_OBJECTS`` objects.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from kvwatch.instrumentation.registries import CONTAINERS, object_fields

MAX_OBJECTS = 2000
PACKAGE = "lightllm."


def _lightllm_object(obj: object) -> bool:
    module = getattr(type(obj), "__module__", "") or ""
    return module.startswith(PACKAGE) and not isinstance(obj, type)


def walk(roots: dict[str, object]) -> dict[str, int]:
    """The length of every container reachable from ``roots`` through LightLLM objects."""
    sizes: dict[str, int] = {}
    seen: set[int] = set()
    queue: deque[tuple[str, object]] = deque(roots.items())
    while queue and len(seen) < MAX_OBJECTS:
        path, obj = queue.popleft()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, CONTAINERS):
            sizes[path] = len(obj)
            continue
        if not _lightllm_object(obj):
            continue
        for name, value in object_fields(obj):
            if isinstance(value, CONTAINERS) or _lightllm_object(value):
                queue.append((f"{path}.{name}", value))
    return sizes


def roots(parts: Any) -> dict[str, object]:
    """Where a walk over one run's LightLLM objects starts."""
    return {
        "radix": parts.radix,
        "mem_manager": parts.mem,
        "req_manager": parts.req_manager,
        "small_page_buffers": parts.small,
        "infer_context": parts.ctx,
    }
