"""Shared-prefix waits: a queued request that shares a long prefix with a
request still computing it waits for that request instead of computing the
prefix a second time.

::

    running  q   [ cached ][ computing ........................ ]
    queued   r   [ cached ][ same tokens ......... ]s[ r's own ...
                                                   └ q captures a BRANCH snapshot
                                                     at s (page-aligned) as it
                                                     passes, and keeps it; r is
                                                     admitted once q has passed s,
                                                     and resumes there

Without the wait, r computes ``[cached, s)`` again beside q. For the hybrid
cache the wait is also the only way r can resume at s at all: recurrent state
exists only where a snapshot was captured, and nobody knows s is a branch
point until r shows up. (SGLang's scheduler makes the same check for requests
in one batch; this one also covers requests that arrive while q runs.)

A wait never blocks the queue: the requests behind r are admitted as usual.
It lasts only while q runs and has not reached s, so it ends when q computes
past s, finishes, or leaves the running set (retracted, paused, aborted).
"""

from __future__ import annotations

from kvwatch.engine.cache.owner import OwnerKind
from kvwatch.engine.cache.protocol import BranchPromises
from kvwatch.engine.request import Request, Status


def shared_len(a: list[int], b: list[int], limit: int) -> int:
    """Length of the common prefix of ``a[:limit]`` and ``b[:limit]``.

    A binary search over slice compares: each compare runs in C, so a few
    thousand tokens cost about a dozen of them rather than a Python loop.
    """
    lo, hi = 0, min(limit, len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo + 1 < hi:  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PrefixWaits:
    """One step's waits, built while the scheduler walks its queue.

    ``promises`` (holder id -> depths) and ``wanted`` go to
    ``BranchPromises.promise`` at the end of the step's scheduling: each
    sharer captures and keeps the state its waiters need, and a kept snapshot
    stays until no queued request wants it (a waiter may still be queued, for
    want of batch room, after its sharer finished).
    """

    def __init__(self, branches: BranchPromises, page_size: int, running: list[Request]) -> None:
        self.branches = branches
        self.page = page_size
        self.enabled = branches.branch_waits
        self.sharers = [r for r in running if self._sharer(r)]
        self.promises: dict[int, frozenset[int]] = {}
        self.wanted: set[object] = set()  # kept snapshots a queued request still needs
        self.decided: dict[str, bool] = {}  # request id -> waits, once per step

    def admitted(self, req: Request) -> None:
        """``req`` was admitted this step: later requests may wait for it."""
        if self._sharer(req):
            self.sharers.append(req)

    def waits(self, req: Request) -> bool:
        """Whether ``req`` should wait this step for a sharer to pass its branch point.

        Either way, a sharer that will pass the point, or has passed it
        capturing for ``req`` (it promised the point last step), promises it
        again, so the state there is captured and kept while ``req`` is queued.
        """
        if not self.enabled or not _may_wait(req):
            return False
        if req.id not in self.decided:
            self.decided[req.id] = self._decide(req)
        return self.decided[req.id]

    def _decide(self, req: Request) -> bool:
        limit = req.prompt_len - 1  # the last prompt token is always computed
        self.wanted |= self.branches.kept_on_path(req.tokens, req.extra_key, limit)
        for q in self.sharers:
            if q.extra_key != req.extra_key:
                continue
            h = q.holder
            s = shared_len(req.tokens, q.tokens, limit) // self.page * self.page
            ahead = s > h.computed_len and s > h.cached_len
            if ahead or s in self.branches.promised_by(h):
                self.promises[h.id] = self.promises.get(h.id, frozenset()) | {s}
                return ahead
        return False

    def _sharer(self, req: Request) -> bool:
        """A running request others may wait for: one still computing its
        prompt, or one that promised a branch point last step."""
        h = req.holder
        return (
            req.status is Status.RUNNING
            and h is not None
            and h.kind is OwnerKind.REQUEST
            and (h.computed_len < req.prompt_len or bool(self.branches.promised_by(h)))
        )


def _may_wait(req: Request) -> bool:
    """A fresh request: not a session turn (its slot has its own pages), not
    one recovering or resumed after a pause (it ran before; it takes what the
    cache holds now, as a retracted one does)."""
    return (
        req.status is Status.WAITING
        and not req.admitted
        and req.holder is None
        and req.session is None
    )
