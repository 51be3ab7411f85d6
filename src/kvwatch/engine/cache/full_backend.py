"""FullAttentionPrefixCache: the radix backend for a model with full attention only.

Where every layer attends to the whole history, the K/V of a prefix is all a
request needs to resume after it: every node of the tree is a resume point,
and there is no continuation state to capture, keep or restore. So, against
``RadixPrefixCache``:

* ``match`` splits the node the match ends inside (as a full-attention radix
  cache does) and locks the whole walk: the holder resumes at the hit,
  ``resume_len == hit_len``; no snapshot is looked for or restored;
* holders keep no working state: no ``linear.state`` page and no ``swa.kv``
  window (``_keeps_state`` is False), so ``page_table(h).linear`` is -1;
* ``capture_points`` names none, so nodes never carry a snapshot, and the
  state groups' pools stay empty (they exist only because ``CacheConfig``
  always describes them);
* a retracted holder recovers by matching again like a new one: the radix
  backend keeps a host ref only on a complete snapshot, and there is none.

Everything else (commit, adoption, locks, eviction, the audit) is the radix
backend's, unchanged. The reference engine's model is hybrid and never builds
this backend; the peer benchmark against SGLang's ``RadixCache`` does
(tests/targets/test_bench_peer.py).
"""

from __future__ import annotations

from kvwatch.engine.cache.holder import Holder, PendingKind
from kvwatch.engine.cache.node import Node
from kvwatch.engine.cache.protocol import Handle
from kvwatch.engine.cache.radix import Walk
from kvwatch.engine.cache.radix_backend import RadixPrefixCache


class FullAttentionPrefixCache(RadixPrefixCache):
    _keeps_state = False

    def _walk(self, holder: Holder) -> Walk:
        """The walk, its last node split where the match ends inside it: every
        matched page is usable history, so the holder resumes at ``hit_len``."""
        tree = self._store.tree
        walk = super()._walk(holder)
        parent = walk.nodes[-1] if walk.nodes else tree.root
        if walk.hit_len > parent.depth:
            child = tree.child(parent, holder.extra_key, holder.tokens, parent.depth)
            assert child is not None, "a walk ends inside a child it matched"
            upper = tree.split(child, (walk.hit_len - parent.depth) // self.page_size)
            walk = Walk([*walk.nodes, upper], walk.hit_len)
        return walk

    def _lock_on_descent(self, walk: Walk) -> Node | None:
        """Lock the whole walk, root included, and touch its last node; a miss locks nothing."""
        if not walk.nodes:
            return None
        self._store.tree.lock_used(walk.nodes)
        return walk.nodes[-1]

    def _activate(self, holder: Holder, anchor: Node | None) -> None:
        """Borrow the anchor's path as the holder's full.kv prefix; no state to restore."""
        self._borrow_path(holder, anchor)

    def capture_points(self, h: Handle, start: int, end: int) -> list[tuple[int, PendingKind]]:
        """None: the history alone resumes a full-attention model."""
        return []
