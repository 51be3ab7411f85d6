"""Registry sizes for SGLang: every container its cache, session and pool objects hold.

kvwatch's ``quiescence`` detector compares, before a run and once it has
drained (sessions closed, cache flushed), the length of every container the
engine holds. This is ``kvwatch.targets.object_walk`` over SGLang's objects,
by SGLang's ``RULES``:

* start from the loop's SGLang objects (``roots``): the tree cache (and the
  cache under a session wrapper, and the ``StreamingSession`` it owns), the
  session controller, the request-to-token pool, the KV allocator (with its
  sub-allocators), the mamba pool and slot allocator;
* follow attributes of objects whose class is defined in an ``sglang.``
  module, and for a dict of containers report also the sum of their lengths
  (``path[*]``);
* never report an allocator's free group (``FREE_GROUPS``): frees held back
  between ``free_group_begin`` and ``free_group_end``, whose list, before
  0.5.22, keeps the last group's (already freed) pages until the next begin;
* a container SGLang bounds on purpose is named in ``BOUNDED`` with the
  module constant that bounds it (``UnifiedSessionRefTracker._closed_session_ids``,
  the last ``_CLOSED_SESSION_TOMBSTONE_LIMIT`` closed session ids): it is
  left out of the sizes and reported (``Walk.breaches``) only above its bound.

Invariant: reading only; a walk visits at most ``MAX_OBJECTS`` objects.
"""

from __future__ import annotations

import sys
from typing import Any

from kvwatch.targets import object_walk
from kvwatch.targets.object_walk import Walk, WalkRules

MAX_OBJECTS = 4000
PACKAGE = "sglang."
# (class, attribute) -> the constant in the class's module that bounds it
BOUNDED = {("UnifiedSessionRefTracker", "_closed_session_ids"): "_CLOSED_SESSION_TOMBSTONE_LIMIT"}
FREE_GROUPS = ("free_group", "swa_free_group")


def _bound(obj: object, name: str) -> int | None:
    const = BOUNDED.get((type(obj).__name__, name))
    module = sys.modules.get(type(obj).__module__)
    return getattr(module, const, None) if const and module is not None else None


RULES = WalkRules(
    package=PACKAGE, max_objects=MAX_OBJECTS, sums=True, skipped=FREE_GROUPS, bound=_bound
)


def walk(roots: dict[str, object]) -> Walk:
    """The length of every container reachable from ``roots`` through SGLang
    objects, and the bounded ones over their bound."""
    return object_walk.walk(roots, RULES)


def roots(loop: Any) -> dict[str, object]:
    """Where a walk over one loop's SGLang objects starts."""
    cache = loop.tree_cache
    return {
        "tree_cache": cache,
        "tree_cache.inner": getattr(cache, "__dict__", {}).get("inner"),
        "sessions": loop.sessions,
        "req_to_token_pool": loop.pools.req_to_token_pool,
        "allocator": loop.pools.allocator,
    }
