"""The release's own event loop, run one iteration at a time.

``PacedLoop(scheduler)`` starts the loop a release runs
(``run_event_loop`` from 0.5.10rc0, which picks normal or overlap as the
scheduler process does; before, ``event_loop_overlap`` or
``event_loop_normal``) in a thread of its own, and parks that thread at the
top of every iteration: in the scheduler's ``recv_requests`` (0.5.13+:
``request_receiver.recv_requests``), the first call of each iteration.
``step()`` lets exactly one iteration run and waits until the loop is back
at that call, so between two steps the caller may read every structure of
the scheduler, and nothing of the loop body is re-written here (the overlap
loop's local ``result_queue`` lives on). An exception the loop raises is
raised again by the ``step()`` that ran it; ``stop()`` ends the thread.

Invariant: the loop thread and the caller never run at the same time (one
of them always waits on a semaphore), so reads between steps see a
scheduler at rest.
"""

from __future__ import annotations

import threading
from typing import Any


class _Stop(BaseException):
    """Raised in the loop thread at its next receive: the loop is over."""


class _PacedReceiver:
    """A frozen ``SchedulerRequestReceiver`` (0.5.13+) with its receive paced."""

    def __init__(self, receiver: Any, recv: Any) -> None:
        self._receiver, self.recv_requests = receiver, recv

    def __getattr__(self, name: str) -> Any:
        return getattr(self._receiver, name)


class PacedLoop:
    def __init__(self, scheduler: Any, *, overlap: bool = False) -> None:
        self.scheduler = scheduler
        self.go, self.back = threading.Semaphore(0), threading.Semaphore(0)
        self.error: BaseException | None = None
        self.stopping = False
        self.iterations = 0
        self._pace()
        loop = getattr(scheduler, "run_event_loop", None)
        if loop is None:
            loop = scheduler.event_loop_overlap if overlap else scheduler.event_loop_normal
        self.thread = threading.Thread(target=self._body, args=(loop,), daemon=True)
        self.thread.start()
        self.back.acquire()  # parked before its first iteration
        self._raise()

    def _pace(self) -> None:
        """Wrap the loop's first call of each iteration so that it waits for ``step``."""
        receiver = getattr(self.scheduler, "request_receiver", None)
        owner = receiver if receiver is not None else self.scheduler
        recv = owner.recv_requests

        def paced(*args: Any, **kwargs: Any) -> Any:
            self.back.release()  # the previous iteration is over
            self.go.acquire()
            if self.stopping:
                raise _Stop()
            self.iterations += 1
            return recv(*args, **kwargs)

        if receiver is not None:
            self.scheduler.request_receiver = _PacedReceiver(receiver, paced)
        else:
            self.scheduler.recv_requests = paced

    def _body(self, loop: Any) -> None:
        try:
            loop()
        except _Stop:
            pass
        except BaseException as exc:
            self.error = exc
            self.back.release()

    def _raise(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def step(self) -> None:
        """One iteration of the release's loop."""
        self._raise()
        if not self.thread.is_alive():
            raise RuntimeError("the scheduler's event loop has ended")
        self.go.release()
        self.back.acquire()
        self._raise()

    def stop(self) -> None:
        self.stopping = True
        if self.thread.is_alive():
            self.go.release()
            self.thread.join(5)
