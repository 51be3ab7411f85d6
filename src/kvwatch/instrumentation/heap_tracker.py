"""The heap sampler: tracemalloc snapshots, each compared with the one before.

One sampler serves every path that watches a heap: ``GET
/debug/tracemalloc/snapshot`` in the server, and runs recorded in process
(the pytest plugin). A *scope* is a name and file globs: a snapshot in that
scope counts only what code in those files allocated, and its sites
(``by_site``, ``file:line``) are what the heap detector follows. The scope
``process`` counts everything.

A sample is JSON-ready, in the shape the snapshot endpoint answers::

    {"scope": "engine", "traced_bytes": 123456, "peak_bytes": 234567,
     "by_site": {"/.../records.py:88": 4096, ...},
     "top_growth": [{"size_diff": 512, "size": 4096, "count_diff": 2,
                     "traceback": ["/.../records.py:88", ...]}, ...],
     "since_mark": [{"site": "/.../worker.py:120", "size_diff": 9000,
                     "count_diff": 150}, ...]}

Other threads of the process may be mid-way through work of their own when a
snapshot is taken (a batch of spans being written, its strings alive for a
moment): ``settle``, called before every snapshot, lets them finish it, so
what a snapshot holds is what is kept, not what happened to be in flight.

``mark`` keeps a scope's snapshot as a fixed reference: every later sample
also reports the growth by site since then (``since_mark``, growing sites
only, largest first), which is what is left of a stretch of work between two
quiet moments.

Nothing here imports the engine or the instrumentation.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable, Mapping
from types import MappingProxyType

TRACE_FRAMES = 16
PROCESS = "process"


class NotTracing(RuntimeError):
    """A snapshot was asked for before ``start``."""


class HeapTracker:
    # one snapshot per scope (registry walks check the bound)
    __bounded__ = MappingProxyType({"scopes": 8, "last": 8, "marks": 8})

    def __init__(
        self,
        scopes: Mapping[str, str | tuple[str, ...]],
        settle: Callable[[], object] | None = None,
    ) -> None:
        """``scopes``: name -> file glob(s), besides ``process`` (everything); a
        glob that starts with ``!`` leaves those files out. ``settle`` is called
        before every snapshot (see above)."""
        self.settle = settle
        self.scopes = {
            PROCESS: None,
            **{k: (v,) if isinstance(v, str) else tuple(v) for k, v in scopes.items()},
        }
        self.last: dict[str, tracemalloc.Snapshot] = {}
        self.marks: dict[str, tracemalloc.Snapshot] = {}

    def start(self, frames: int = TRACE_FRAMES) -> dict:
        """Trace with ``frames`` frames per allocation (restarting if the depth
        differs: fewer frames cost less per allocation) and take the baseline
        every scope's next sample is compared with."""
        if tracemalloc.is_tracing() and tracemalloc.get_traceback_limit() != frames:
            tracemalloc.stop()
        if not tracemalloc.is_tracing():
            tracemalloc.start(frames)
        snap = self._snapshot()
        self.last = {name: self._scoped(snap, name) for name in self.scopes}
        self.marks = {}
        return {"tracing": True, "frames": tracemalloc.get_traceback_limit()}

    def stop(self) -> None:
        tracemalloc.stop()
        self.last, self.marks = {}, {}

    def mark(self, scope: str = PROCESS) -> dict:
        """Keep ``scope``'s heap now as the reference of later samples' ``since_mark``."""
        self._check(scope)
        self.marks[scope] = self._scoped(self._snapshot(), scope)
        return {"scope": scope, "marked": True}

    def _snapshot(self) -> tracemalloc.Snapshot:
        if self.settle is not None:
            self.settle()
        return _snapshot()

    def _check(self, scope: str) -> None:
        if scope not in self.scopes:
            raise ValueError(f"unknown heap scope {scope!r}; scopes are {', '.join(self.scopes)}")
        if not tracemalloc.is_tracing():
            raise NotTracing("heap tracking is off")

    def sample(self, scope: str = PROCESS, top: int = 10, sites: int = 0) -> dict:
        """Live bytes in ``scope`` now, its ``sites`` largest allocation sites, and
        the ``top`` largest growths by traceback since its previous sample."""
        self._check(scope)
        snap = self._scoped(self._snapshot(), scope)
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
            "since_mark": self._since_mark(snap, scope, top),
        }

    def _since_mark(self, snap: tracemalloc.Snapshot, scope: str, top: int) -> list[dict]:
        mark = self.marks.get(scope)
        if mark is None:
            return []
        grown = [s for s in snap.compare_to(mark, "lineno") if s.size_diff > 0]
        return [
            {
                "site": f"{s.traceback[0].filename}:{s.traceback[0].lineno}",
                "size_diff": s.size_diff,
                "count_diff": s.count_diff,
            }
            for s in grown[:top]
        ]

    def _scoped(self, snap: tracemalloc.Snapshot, scope: str) -> tracemalloc.Snapshot:
        files = self.scopes[scope]
        if files is None:
            return snap
        return snap.filter_traces(
            [tracemalloc.Filter(not f.startswith("!"), f.removeprefix("!")) for f in files]
        )


def _snapshot() -> tracemalloc.Snapshot:
    """Everything but tracemalloc's own bookkeeping and frozen modules, after a
    full collection: it frees unreachable cycles and empties CPython's free
    lists (tuples, lists, dicts, floats), whose parked blocks tracemalloc would
    otherwise still count against the site that first allocated them."""
    gc.collect()
    return tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen *>")]
    )
