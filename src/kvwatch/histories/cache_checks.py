"""The checks that replay a cache's own log (``driver/cache_watch.py``), not its state.

``index``       every event of the cache index, in order, against a model of the
                index built from those events alone:
                * a key is stored only where the model lacks it (no second store
                  of a key without its removal in between), and a removal names a
                  key the model holds, on the block it was stored on;
                * a block sits under one key at a time (once stored, no other key,
                  shorter or not, aliases it);
                * after every step and at the end the model is the index the
                  engine holds (every key on its block): events that the index
                  does not bear out, or changes the events never told, show at
                  the step they happen, not at the next barrier.
``references``  every reference a lookup or commit takes, the root's included, is
                given back for the holder it was taken for:
                * by the time the holder's request ends (a session's holder
                  outlives its turns: it is held to the end instead);
                * all of them once the history is over;
                * no holder gives back more than it took, and after every step
                  each node's count is the sum the log implies (a reference taken
                  or dropped without being told shows there).

Invariant: both read only the log; the same log gives the same findings.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from kvwatch.targets.driver.cache_watch import (
    INDEX,
    REFERENCES,
    Cleared,
    Entry,
    RefsMoved,
    Removed,
    RequestEnded,
    Seen,
    Split,
    Stored,
)


class CacheFinding(NamedTuple):
    check: str  # INDEX or REFERENCES
    detail: str
    key: str  # the rule broken: what makes two findings the same bug
    rid: str = ""


def _short(keys: Iterable[int], n: int = 3) -> str:
    keys = list(keys)
    more = f" and {len(keys) - n} more" if len(keys) > n else ""
    return ", ".join(f"{k:x}"[:8] for k in keys[:n]) + more


def index(log: Sequence[Entry]) -> list[CacheFinding]:
    """The index's events against a model built from them (rules above)."""
    model: dict[int, int] = {}  # key -> block
    owner: dict[int, int] = {}  # block -> key
    out: dict[str, CacheFinding] = {}  # the first finding of each rule

    def found(rule: str, detail: str) -> None:
        out.setdefault(rule, CacheFinding(check=INDEX, detail=detail, key=rule))

    for e in log:
        if isinstance(e, Stored):
            for key, block in zip(e.keys, e.blocks, strict=True):
                if key in model:
                    found("stored twice", f"key {key:x} stored again on block {block} while "
                          f"it still names block {model[key]}")  # fmt: skip
                elif block in owner:
                    found("aliased block", f"block {block} stored under key {key:x} while key "
                          f"{owner[block]:x} still names it")  # fmt: skip
                model[key], owner[block] = block, key
        elif isinstance(e, Removed):
            for key, block in zip(e.keys, e.blocks, strict=True):
                if model.get(key) != block:
                    found("removed unheld", f"key {key:x} removed from block {block}, but the "
                          f"events stored it on {model.get(key, 'no block')}")  # fmt: skip
                model.pop(key, None)
                if owner.get(block) == key:
                    del owner[block]
        elif isinstance(e, Cleared):
            model.clear()
            owner.clear()
        elif isinstance(e, Seen) and e.index != model:
            told = {k for k in model if e.index.get(k) != model[k]}
            untold = {k for k in e.index if model.get(k) != e.index[k]}
            found("disagrees", f"at {e.where} the events name {len(told)} key(s) the index does "
                  f"not hold as told ({_short(told)}) and the index holds {len(untold)} key(s) "
                  f"never told ({_short(untold)})")  # fmt: skip
            model, owner = dict(e.index), {b: k for k, b in e.index.items()}  # go on from truth
    return list(out.values())


def _label(holder: str) -> str:
    return holder.partition(":")[2]


def references(log: Sequence[Entry], session_rids: Mapping[str, str]) -> list[CacheFinding]:
    """References per holder and node, replayed (rules above). ``session_rids``: the
    requests that were session turns (their holders are their sessions')."""
    held: dict[str, Counter[int]] = defaultdict(Counter)  # holder -> node -> references
    out: dict[str, CacheFinding] = {}

    def found(rule: str, detail: str, rid: str = "") -> None:
        out.setdefault(rule, CacheFinding(check=REFERENCES, detail=detail, key=rule, rid=rid))

    def holding(label: str) -> dict[str, dict[int, int]]:
        return {
            h: {n: c for n, c in nodes.items() if c > 0}
            for h, nodes in held.items()
            if _label(h) == label and any(c > 0 for c in nodes.values())
        }

    for e in log:
        if isinstance(e, RefsMoved):
            nodes = held[e.holder]
            for n in e.nodes:
                nodes[n] += e.delta
                if nodes[n] < 0:
                    who = f"holder {e.holder}" if e.holder else "a call made for no holder"
                    found("given back twice", f"{who} gave back a reference to node {n} it "
                          "never took")  # fmt: skip
        elif isinstance(e, Split):
            for nodes in held.values():
                if nodes[e.node]:
                    nodes[e.upper] += nodes[e.node]
        elif isinstance(e, RequestEnded) and e.rid not in session_rids:
            if still := holding(e.rid):
                found("kept past its request", f"request {e.rid} ended with references still "
                      f"taken for it: {still}", e.rid)  # fmt: skip
        elif isinstance(e, Seen):
            implied: Counter[int] = Counter()
            for nodes in held.values():
                implied.update({n: c for n, c in nodes.items() if c > 0})
            if dict(implied) != dict(e.refs):
                odd = {
                    n: (e.refs.get(n, 0), implied.get(n, 0))
                    for n in set(implied) | set(e.refs)
                    if e.refs.get(n, 0) != implied.get(n, 0)
                }
                found("untold", f"at {e.where} node refs differ from what the log implies "
                      f"(node: (held, told)) {dict(list(odd.items())[:4])}")  # fmt: skip
    left = {h: {n: c for n, c in nodes.items() if c > 0} for h, nodes in held.items()}
    if left := {h: nodes for h, nodes in left.items() if nodes}:
        found("never given back", f"after the history ended references are still taken: "
              f"{dict(list(left.items())[:4])}")  # fmt: skip
    return list(out.values())
