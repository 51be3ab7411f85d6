"""Tally: a monotonic counter for hot paths, kept as plain sums.

A synchronous OTel ``Counter.add`` costs tens of microseconds (attribute
cleaning, a view match and an aggregation lock per call); an engine emits a
``TokensGenerated`` per request per step. A ``Tally`` adds into a dict keyed
by the attribute items instead, and reports the running sums through an
asynchronous counter when a reader collects, which is the same cumulative sum
a synchronous counter exports.

One writer (the engine thread) adds; readers (a scrape, an export) only copy
the sums, under the same lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from types import MappingProxyType

from opentelemetry.metrics import CallbackOptions, Meter, Observation

AttrKey = tuple[tuple[str, str], ...]  # sorted attribute items


MAX_ATTRIBUTE_SETS = 64


def attr_key(attrs: dict[str, str]) -> AttrKey:
    return tuple(sorted(attrs.items()))


class Tally:
    # one sum per attribute set: bounded by the attributes' values, which come from
    # small vocabularies (operation, model, reason, stage); registry walks check it
    __bounded__ = MappingProxyType({"_sums": MAX_ATTRIBUTE_SETS})

    def __init__(self, meter: Meter, name: str, unit: str, description: str) -> None:
        self._sums: dict[AttrKey, int] = {}
        self._lock = threading.Lock()
        meter.create_observable_counter(name, [self._observe], unit=unit, description=description)

    def add(self, value: int, key: AttrKey = ()) -> None:
        with self._lock:
            self._sums[key] = self._sums.get(key, 0) + value

    def _observe(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            sums = list(self._sums.items())
        return [Observation(total, dict(key)) for key, total in sums]
