"""The heap sampler: tracemalloc snapshots, each compared with the one before.

One sampler serves every path that watches a heap: ``GET
/debug/tracemalloc/snapshot`` in the server, and runs recorded in process
(the pytest plugin). A *scope* is a name and a file glob: a snapshot in that
scope counts only what code in those files allocated, and its sites
(``by_site``, ``file:line``) are what the heap detector follows. The scope
``process`` counts everything.

A sample is JSON-ready, in the shape the snapshot endpoint answers::

    {"scope": "engine", "traced_bytes": 123456, "peak_bytes": 234567,
     "by_site": {"/.../records.py:88": 4096, ...},
     "top_growth": [{"size_diff": 512, "size": 4096, "count_diff": 2,
                     "traceback": ["/.../records.py:88", ...]}, ...]}

Nothing here imports the engine or the instrumentation.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Mapping

TRACE_FRAMES = 16
PROCESS = "process"


class NotTracing(RuntimeError):
    """A snapshot was asked for before ``start``."""


class HeapTracker:
    # one snapshot per scope (registry walks skip them)
    __bounded__ = ("scopes", "last")

    def __init__(self, scopes: Mapping[str, str]) -> None:
        """``scopes``: name -> file glob, besides ``process`` (everything)."""
        self.scopes = {PROCESS: None, **scopes}
        self.last: dict[str, tracemalloc.Snapshot] = {}

    def start(self, frames: int = TRACE_FRAMES) -> dict:
        """Trace with ``frames`` frames per allocation (restarting if the depth
        differs: fewer frames cost less per allocation) and take the baseline
        every scope's next sample is compared with."""
        if tracemalloc.is_tracing() and tracemalloc.get_traceback_limit() != frames:
            tracemalloc.stop()
        if not tracemalloc.is_tracing():
            tracemalloc.start(frames)
        snap = _snapshot()
        self.last = {name: self._scoped(snap, name) for name in self.scopes}
        return {"tracing": True, "frames": tracemalloc.get_traceback_limit()}

    def stop(self) -> None:
        tracemalloc.stop()
        self.last = {}

    def sample(self, scope: str = PROCESS, top: int = 10, sites: int = 0) -> dict:
        """Live bytes in ``scope`` now, its ``sites`` largest allocation sites, and
        the ``top`` largest growths by traceback since its previous sample."""
        if scope not in self.scopes:
            raise ValueError(f"unknown heap scope {scope!r}; scopes are {', '.join(self.scopes)}")
        if not tracemalloc.is_tracing():
            raise NotTracing("heap tracking is off")
        snap = self._scoped(_snapshot(), scope)
        last = self.last.get(scope)
        growth = snap.compare_to(last, "traceback") if last else []
        self.last[scope] = snap
        current, peak = tracemalloc.get_traced_memory()
        by_line = snap.statistics("lineno")
        return {
            "scope": scope,
            "traced_bytes": current if scope == PROCESS else sum(s.size for s in by_line),
            "peak_bytes": peak,
            "by_site": {
                f"{s.traceback[0].filename}:{s.traceback[0].lineno}": s.size
                for s in by_line[:sites]
            },
            "top_growth": [
                {
                    "size_diff": s.size_diff,
                    "size": s.size,
                    "count_diff": s.count_diff,
                    "traceback": [f"{f.filename}:{f.lineno}" for f in s.traceback],
                }
                for s in growth[:top]
            ],
        }

    def _scoped(self, snap: tracemalloc.Snapshot, scope: str) -> tracemalloc.Snapshot:
        files = self.scopes[scope]
        return snap if files is None else snap.filter_traces([tracemalloc.Filter(True, files)])


def _snapshot() -> tracemalloc.Snapshot:
    """Everything but tracemalloc's own bookkeeping and frozen modules."""
    return tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen *>")]
    )
