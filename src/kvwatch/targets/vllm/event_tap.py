"""The driver's consumer of vLLM's KV cache events, in vLLM's Python.

With events on (``kv_layout.Layout.events``), vLLM's scheduler publishes a
``KVEventBatch`` through its ``kv_event_publisher`` at the end of every
``update_from_output``. ``EventTap.install`` puts itself in front of that
publisher (the ``null`` one the layout configures, which still gets every
batch): each batch goes to an ``event_ledger.EventLedger`` in order, and
``check`` compares the ledger with the pool's prefix index. The driver calls
``check`` right after each ``update_from_output`` and at every barrier
(``drain`` first takes what the pool queued since, as the next publish
would: ``reset_prefix_cache``'s ``AllBlocksCleared`` at the run's end).

Invariant: every event the pool queued reaches the ledger exactly once,
in the order the pool queued it; with events off ``install`` returns None.
"""

from __future__ import annotations

from kvwatch.targets.vllm.event_ledger import EventLedger
from kvwatch.targets.vllm.manager_audit import Violation
from kvwatch.targets.vllm.scheduler_reads import group_managers


def pools(scheduler) -> list:
    """Each block pool the groups use, once."""
    out: dict[int, object] = {}
    for _, manager in group_managers(scheduler):
        out.setdefault(id(manager.block_pool), manager.block_pool)
    return list(out.values())


class EventTap:
    """The scheduler's publisher, with every batch also given to an ``EventLedger``."""

    def __init__(self, scheduler) -> None:
        from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

        self.inner = scheduler.kv_event_publisher
        self.ledger = EventLedger(maybe_convert_block_hash)
        self.pending: list[Violation] = []
        self.batches = 0

    @classmethod
    def install(cls, scheduler) -> EventTap | None:
        """Tap ``scheduler``'s events; None when its pool queues none."""
        if not getattr(scheduler, "enable_kv_cache_events", False):
            return None
        tap = cls(scheduler)
        scheduler.kv_event_publisher = tap
        return tap

    def publish(self, batch) -> None:
        self.batches += 1
        self.pending += self.ledger.take(batch.events)
        if self.inner is not None:
            self.inner.publish(batch)

    def shutdown(self) -> None:
        if self.inner is not None:
            self.inner.shutdown()

    def __getattr__(self, name):  # the rest of the publisher's interface
        return getattr(object.__getattribute__(self, "inner"), name)

    def drain(self, scheduler) -> None:
        """Take the events the pool queued since the last batch, as the next batch would."""
        events = scheduler.kv_cache_manager.take_events()
        if events:
            self.batches += 1
            self.pending += self.ledger.take(events)

    def check(self, scheduler) -> list[Violation]:
        """The removals that had no store since the last check, and the ledger against
        the pools' prefix indexes now (valid right after a batch)."""
        found, self.pending = self.pending, []
        return found + self.ledger.check(pools(scheduler))
