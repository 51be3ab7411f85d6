"""``mutation``: a cache call's events reach listeners once the call is complete.

Every public call that changes the cache runs inside ``EventBus.deferred()``:
what it emits is queued and delivered, in emit order, when the outermost such
call returns or raises, so a listener never sees a half-made change (an
evicted leaf still in the tree, a snapshot taken but not attached).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Protocol, TypeVar

from kvwatch.engine.events import EventBus

F = TypeVar("F", bound=Callable)


class Emits(Protocol):
    """An object whose calls emit on ``_events``."""

    _events: EventBus


def mutation(fn: F) -> F:
    """Deliver the events ``fn`` emits once it returns (or raises): never mid-change."""

    @functools.wraps(fn)
    def wrapper(self: Emits, *args, **kwargs):
        with self._events.deferred():
            return fn(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]
