"""A ``Played`` as plain JSON and back: how a driver process sends a played history home.

An engine that runs in a Python of its own (vLLM's) plays a history there
with the same player (``play.py``) and writes what it recorded as one JSON
object; kvwatch's process reads it back and judges it as it judges a history
played in process. Every field round-trips: tuples of tokens as lists, the
probe's reports through ``ProbeReport.to_json``, a refused operation as the
operation and the engine's words, the cache log as tagged entries::

    {"history": {...}, "sent": {rid: {...}}, "ended": {rid: {...}},
     "refused": [[op, why], ...], "stages": {...}, "aborted_in": {...},
     "reports": [[where, report], ...], "final": report | null,
     "error": "", "error_at": "", "stuck": "", "steps": N,
     "cache_log": [["Stored", {...}], ...] | null, "cache_tells": [...]}

Invariant: ``played_from_json(played_to_json(p)) == p`` for every ``Played``
(the checks read the same record either side of the process boundary).
"""

from __future__ import annotations

from typing import Any

from kvwatch.contracts import ProbeReport
from kvwatch.histories.ops import History, Op
from kvwatch.histories.play import Ended, Played, Sent
from kvwatch.targets.driver import cache_watch

ENTRIES = {
    cls.__name__: cls
    for cls in (
        cache_watch.Stored,
        cache_watch.Removed,
        cache_watch.Cleared,
        cache_watch.RefsMoved,
        cache_watch.Split,
        cache_watch.RequestEnded,
        cache_watch.Seen,
    )
}


def _tokens(t: tuple[int, ...] | None) -> list[int] | None:
    return None if t is None else list(t)


def _entry_to_json(entry: cache_watch.Entry) -> list:
    fields = entry._asdict()
    if isinstance(entry, cache_watch.Seen):  # int keys: pairs, since JSON keys are strings
        fields = {**fields, "index": list(entry.index.items()), "refs": list(entry.refs.items())}
    return [type(entry).__name__, fields]


def _entry_from_json(raw: list) -> cache_watch.Entry:
    name, fields = raw
    if name not in ENTRIES:
        raise ValueError(f"unknown cache log entry {name!r}; entries are {sorted(ENTRIES)}")
    cls = ENTRIES[name]
    if cls is cache_watch.Seen:
        return cls(
            fields["where"], dict(map(tuple, fields["index"])), dict(map(tuple, fields["refs"]))
        )
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def played_to_json(played: Played) -> dict[str, Any]:
    return {
        "history": played.history.to_json(),
        "sent": {
            rid: {**s._asdict(), "expected": list(s.expected)} for rid, s in played.sent.items()
        },
        "ended": {
            rid: {**e._asdict(), "input": _tokens(e.input), "output": list(e.output)}
            for rid, e in played.ended.items()
        },
        "refused": [
            [{**op._asdict(), "tokens": list(op.tokens)}, why] for op, why in played.refused
        ],
        "stages": played.stages,
        "aborted_in": played.aborted_in,
        "reports": [[where, r.to_json()] for where, r in played.reports],
        "final": played.final.to_json() if played.final is not None else None,
        "error": played.error,
        "error_at": played.error_at,
        "stuck": played.stuck,
        "steps": played.steps,
        "cache_log": (
            None if played.cache_log is None else [_entry_to_json(e) for e in played.cache_log]
        ),
        "cache_tells": sorted(played.cache_tells),
    }


def played_from_json(data: dict[str, Any]) -> Played:
    ended = {
        rid: Ended(
            **{
                **e,
                "input": None if e["input"] is None else tuple(e["input"]),
                "output": tuple(e["output"]),
            }
        )
        for rid, e in data["ended"].items()
    }
    log = data.get("cache_log")
    return Played(
        history=History.from_json(data["history"]),
        sent={
            rid: Sent(**{**s, "expected": tuple(s["expected"])}) for rid, s in data["sent"].items()
        },
        ended=ended,
        refused=[(Op(**{**op, "tokens": tuple(op["tokens"])}), why) for op, why in data["refused"]],
        stages={rid: list(trail) for rid, trail in data["stages"].items()},
        aborted_in=dict(data["aborted_in"]),
        reports=[(where, ProbeReport.from_json(r)) for where, r in data["reports"]],
        final=ProbeReport.from_json(data["final"]) if data.get("final") else None,
        error=data["error"],
        error_at=data["error_at"],
        stuck=data["stuck"],
        steps=data["steps"],
        cache_log=None if log is None else tuple(_entry_from_json(e) for e in log),
        cache_tells=frozenset(data.get("cache_tells", ())),
    )
