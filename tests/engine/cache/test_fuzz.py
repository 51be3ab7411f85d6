"""Property-based fuzz of the hybrid prefix cache.

Random holders open, match, compute, speculate, commit, retract, recover and
release over a random token trie while eviction, pruning and flushes run in
between. After every operation:

* the audit is clean (ownership, refs, tree structure, counters);
* every page, window and state describes exactly the tokens it is keyed by;
* a cached prefix keeps the page it was first written to until it is evicted,
  and a match hands out exactly those pages;
* a match resumes at least as deep as the deepest complete device snapshot on
  its path (state recovery never gives up a usable anchor).

Small pools keep the cache under pressure (evictions, skipped snapshots,
failed allocations); big pools exercise long sharing chains.
"""

from __future__ import annotations

import pytest
from cachesim import INT_LAYOUTS, SimRunner, cache_config
from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvwatch.engine.cache.audit import audit
from kvwatch.engine.cache.backends import build_cache
from kvwatch.engine.cache.holder import Holder, HolderStatus
from kvwatch.engine.cache.node import Tier
from kvwatch.engine.cache.pool import PoolExhausted
from kvwatch.engine.cache.protocol import Capture, holder_of
from kvwatch.engine.config import (
    FULL_KV,
    LINEAR_STATE,
    STATE_GROUPS,
)
from kvwatch.engine.events import EventBus, NodeEvicted

CONFIGS = {
    "small": cache_config(window=8, interval=16, page=4, full=40, swa=24, snapshots=8, host=4),
    "big": cache_config(window=8, interval=16, page=4, full=2048, swa=512, snapshots=128, host=32),
}
TOKENS = st.integers(0, 2)  # a tiny alphabet makes shared pages and splits common


class CacheMachine(RuleBasedStateMachine):
    SIZE = "small"

    def __init__(self) -> None:
        super().__init__()
        events = EventBus()
        self.cache = build_cache(CONFIGS[self.SIZE], INT_LAYOUTS, events=events)
        self.sim = SimRunner(self.cache)
        self.seqs: list[list[int]] = [[]]  # conversations that finished a turn
        self.first: dict[tuple, int] = {}  # cached prefix -> the page it was first written to
        events.subscribe(NodeEvicted, self._forget_evicted)

    # -- picking holders --------------------------------------------------------------
    def _with(self, status: HolderStatus) -> list[Holder]:
        return [h for h in self.cache.view.holders.values() if h.status is status]

    def _pick(self, data, status: HolderStatus) -> Holder:
        return data.draw(st.sampled_from(sorted(self._with(status), key=lambda h: h.id)))

    def _has(status):
        return precondition(lambda self: bool(self._with(status)))

    # -- rules --------------------------------------------------------------------------
    @precondition(lambda self: len(self.cache.view.holders) < 5)
    @rule(data=st.data(), extra=st.sampled_from([None, None, "x"]))
    def open_and_match(self, data, extra):
        """A new request forks a known conversation, usually near its end."""
        base = data.draw(st.sampled_from(self.seqs[-6:]))
        back = data.draw(
            st.one_of(st.just(0), st.just(0), st.integers(0, 8), st.integers(0, len(base)))
        )
        cut = max(0, len(base) - back)
        tail = data.draw(st.lists(TOKENS, min_size=1, max_size=24))
        tokens = base[:cut] + tail
        holder = holder_of(self.cache.open(tokens, extra_key=extra))
        self._match(holder)

    @_has(HolderStatus.ACTIVE)
    @rule(data=st.data(), n=st.integers(1, 12))
    def compute(self, data, n):
        holder = self._pick(data, HolderStatus.ACTIVE)
        need = holder.computed_len + n - len(holder.tokens)
        if need > 0:  # decoding past the prompt: the "sampled" tokens join the sequence
            holder.tokens += data.draw(st.lists(TOKENS, min_size=need, max_size=need))
        try:
            self.sim.compute(holder.handle, n)
        except PoolExhausted:
            if data.draw(st.booleans()):
                self.cache.retract(holder.handle)

    @_has(HolderStatus.ACTIVE)
    @rule(data=st.data(), chunk=st.integers(1, 24), decode=st.integers(0, 8))
    def run_turn(self, data, chunk, decode):
        """Prefill the rest of the prompt chunk by chunk, decode a few tokens, end the turn."""
        holder = self._pick(data, HolderStatus.ACTIVE)
        target = len(holder.tokens) + decode
        try:
            while holder.computed_len < target:
                n = min(
                    chunk if holder.computed_len < len(holder.tokens) else 1,
                    target - holder.computed_len,
                )
                if holder.computed_len + n > len(holder.tokens):
                    holder.tokens += data.draw(st.lists(TOKENS, min_size=n, max_size=n))
                self.sim.compute(holder.handle, n)
                self.cache.commit_chunk(holder.handle)
        except PoolExhausted:
            self.cache.retract(holder.handle)
            return
        self.cache.commit_chunk(holder.handle, terminal=True)
        self.seqs.append(list(holder.tokens))

    @_has(HolderStatus.ACTIVE)
    @rule(data=st.data(), k=st.integers(1, 4))
    def speculate(self, data, k):
        """Allocate k + 1 slots for drafts, keep the accepted ones, trim the rest."""
        holder = self._pick(data, HolderStatus.ACTIVE)
        if holder.computed_len != len(holder.tokens):
            return
        start = holder.computed_len
        try:
            self.cache.allocate(holder.handle, k + 1)
        except PoolExhausted:
            return
        drafts = data.draw(st.lists(TOKENS, min_size=k + 1, max_size=k + 1))
        holder.tokens += drafts
        self.sim.write(holder.handle, start, self._values(holder, start, start + k + 1))
        accepted = data.draw(st.integers(0, k)) + 1
        del holder.tokens[start + accepted :]
        end = start + accepted
        hashes = self.sim.values(holder.handle)
        caps = [
            Capture(b, kind, self._tensor(hashes[b - 1]))
            for b, kind in self.cache.capture_points(holder.handle, start, end)
        ]
        self.cache.advance(holder.handle, end, caps)
        self.cache.pools[LINEAR_STATE].set_page_data(holder.working[LINEAR_STATE], hashes[end - 1])
        self.cache.trim(holder.handle, end)

    @_has(HolderStatus.ACTIVE)
    @rule(data=st.data(), terminal=st.booleans())
    def commit(self, data, terminal):
        self.cache.commit_chunk(self._pick(data, HolderStatus.ACTIVE).handle, terminal=terminal)

    @_has(HolderStatus.ACTIVE)
    @rule(data=st.data())
    def next_turn(self, data):
        holder = self._pick(data, HolderStatus.ACTIVE)
        holder.tokens += data.draw(st.lists(TOKENS, min_size=1, max_size=16))

    @_has(HolderStatus.ACTIVE)
    @rule(data=st.data())
    def retract(self, data):
        self.cache.retract(self._pick(data, HolderStatus.ACTIVE).handle)

    @_has(HolderStatus.RETRACTED)
    @rule(data=st.data())
    def recover(self, data):
        self._match(self._pick(data, HolderStatus.RETRACTED))

    @precondition(lambda self: bool(self.cache.view.holders))
    @rule(data=st.data(), commit=st.booleans())
    def release(self, data, commit):
        holder = data.draw(
            st.sampled_from(sorted(self.cache.view.holders.values(), key=lambda h: h.id))
        )
        self.cache.release(holder.handle, commit=commit)

    @rule(
        action=st.sampled_from(["evict"] * 4 + ["prune"] * 3 + ["flush"]),
        group=st.sampled_from(STATE_GROUPS),
        n=st.integers(1, 16),
        host=st.booleans(),
    )
    def pressure(self, action, group, n, host):
        """Outside pressure: evict leaves, prune snapshots, or (rarely) flush everything."""
        if action == "evict":
            self.cache._store.evict(FULL_KV, n)
        elif action == "prune":
            self.cache._store.prune(group, n, Tier.HOST if host else Tier.DEVICE)
        else:
            self.cache.flush()

    # -- helpers ------------------------------------------------------------------------
    def _match(self, holder: Holder) -> None:
        walk = self.cache.view.tree.walk(holder.tokens, holder.extra_key, len(holder.tokens) - 1)
        floor = max(
            (
                n.depth
                for n in walk.nodes
                if n.has_complete_snapshot and n.snapshot.tier is Tier.DEVICE
            ),
            default=0,
        )
        try:
            match = self.cache.match(holder.handle)
        except PoolExhausted:
            if holder.status is HolderStatus.NEW:
                self.cache.release(holder.handle, commit=False)
            return
        assert match.resume_len >= floor, "state recovery skipped a usable snapshot"
        assert match.resume_len <= match.hit_len <= len(holder.tokens) - 1
        p = self.cache.page_size
        for j in range(match.resume_len // p):
            key = (holder.extra_key, tuple(holder.tokens[: (j + 1) * p]))
            assert holder.full_pages[j] == self.first[key], (
                "match returned a page other than the first written"
            )
        self.sim.check_holder(holder)

    def _forget_evicted(self, event: NodeEvicted) -> None:
        gone = set(event.page_ids)
        self.first = {key: page for key, page in self.first.items() if page not in gone}

    def _values(self, holder: Holder, start: int, end: int):
        return self._tensor(self.sim.values(holder.handle)[start:end])

    @staticmethod
    def _tensor(values):
        import torch

        return torch.tensor(values, dtype=torch.int64)

    # -- invariants ----------------------------------------------------------------------
    @invariant()
    def audit_is_clean(self):
        report = audit(self.cache.view)
        assert report.clean, "\n".join(str(f) for f in report.findings)
        assert report.root_refs.actual == report.root_refs.expected

    @invariant()
    def values_are_intact(self):
        for holder in self._with(HolderStatus.ACTIVE):
            self.sim.check_holder(holder)
        now = self.sim.tree_prefixes()
        for key, page in now.items():
            assert self.first.get(key, page) == page, (
                f"prefix {key} moved to another page while cached"
            )
        self.first = now


def machine(size: str, seed_value: int) -> type[CacheMachine]:
    @seed(seed_value)
    class Machine(CacheMachine):
        SIZE = size

    return Machine


FUZZ = settings(
    max_examples=20,
    stateful_step_count=80,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.mark.parametrize("size", sorted(CONFIGS))
# the fast tier runs one seed per size; `make test` runs all three
@pytest.mark.parametrize(
    "seed_value", [1, *(pytest.param(s, marks=pytest.mark.slow) for s in (2, 3))]
)
def test_cache_fuzz(size: str, seed_value: int) -> None:
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(machine(size, seed_value), settings=FUZZ)
