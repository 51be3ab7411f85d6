"""A census of the live objects of kvwatch's own classes, by class.

tracemalloc sees every allocation, but it costs every allocation too, so
the gate traces the heap only at low concurrency. A census costs nothing
between two counts: it walks the garbage collector's objects once and
counts the instances of each class defined in kvwatch. A request, a holder,
a session or a span record that outlives its owner shows up as a class
whose count grew with the work done between two quiet moments, at any
concurrency, wherever the reference hides (a closure, a default argument, a
cache no attribute walk reaches).

Only objects the collector tracks are counted: instances of classes with a
``__dict__`` or ``__slots__``, and named tuples holding other objects. The
classes counted are those of what serves (the engine, the server and its
telemetry), not a recorder's own records, which may share the process.
Nothing here imports the engine.
"""

from __future__ import annotations

import gc
from collections import Counter

SERVING = ("kvwatch.engine.", "kvwatch.server.", "kvwatch.instrumentation.")


def census(packages: tuple[str, ...] = SERVING) -> dict[str, int]:
    """Live instances per class defined in ``packages`` (``module.QualName``),
    after a full collection so that garbage is not counted."""
    gc.collect()
    counts: Counter[str] = Counter()
    for obj in gc.get_objects():
        cls = type(obj)
        module = getattr(cls, "__module__", None)
        if isinstance(module, str) and module.startswith(packages) and not isinstance(obj, type):
            counts[f"{module}.{cls.__qualname__}"] += 1
    return dict(counts)
