"""Registry sizes for LightLLM: every container its cache, pool and infer-context objects hold.

kvwatch's ``quiescence`` detector compares, before a run and once it has
drained and its cache was flushed, the length of every container the engine
holds. This is ``kvwatch.targets.object_walk`` over LightLLM's objects, by
LightLLM's ``RULES``:

* start from the tree cache, the memory manager, the request manager, the
  small-page state buffers and ``g_infer_context`` (its
  ``requests_mapping``, ``infer_req_ids``, ...);
* follow attributes of objects whose class is defined in a ``lightllm.``
  module; report every container reached by the first attribute path that
  reaches it (``radix.root_node.children``), and nothing else: no sums, no
  bounds.

kvwatch's stand-ins (the request records, the IO buffer) are not walked:
they are the router's, which is not there.

Invariant: reading only; a walk visits at most ``MAX_OBJECTS`` objects.
"""

from __future__ import annotations

from typing import Any

from kvwatch.targets import object_walk
from kvwatch.targets.object_walk import WalkRules

MAX_OBJECTS = 2000
PACKAGE = "lightllm."
RULES = WalkRules(package=PACKAGE, max_objects=MAX_OBJECTS)


def walk(roots: dict[str, object]) -> dict[str, int]:
    """The length of every container reachable from ``roots`` through LightLLM objects."""
    return object_walk.walk(roots, RULES).sizes


def roots(parts: Any) -> dict[str, object]:
    """Where a walk over one run's LightLLM objects starts."""
    return {
        "radix": parts.radix,
        "mem_manager": parts.mem,
        "req_manager": parts.req_manager,
        "small_page_buffers": parts.small,
        "infer_context": parts.ctx,
    }
