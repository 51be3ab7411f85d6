"""``@pytest.mark.leak_gate(...)``: the marker's arguments, read and checked.

Every argument is a keyword; a positional one, an unknown keyword, an
unknown detector id or a detector the engine's probe cannot feed is a
``MarkerError`` whose message names the marker and what to write instead.
Nothing heavy is imported here until a marked test is set up: the plugin
loads in every pytest run of anyone who installs kvwatch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

MARKER = "leak_gate"
TURN_FIXTURE = "leak_gate_turn"
MARKER_HELP = (
    f"{MARKER}(probe='engine', detectors=None, warmup=2, heap=False, heap_scope=None, "
    "max_pages=None, drain_timeout=5.0): judge the test with kvwatch's leak detectors; "
    f"the {TURN_FIXTURE} fixture records a barrier per turn"
)


class MarkerError(ValueError):
    """A marker the plugin cannot honour; the message is shown as the test's error."""


@dataclass(frozen=True, kw_only=True)
class MarkerOptions:
    """A marked test's gate. Invariants: ``detectors`` are known ids the engine's
    probe can feed (``heap`` among them when ``heap`` is set); ``max_pages`` holds
    (group, pages >= 0) pairs, one per group, sorted; ``warmup >= 0``."""

    probe: str = "engine"  # the fixture whose value is probed
    detectors: tuple[str, ...] = ()
    warmup: int = 2
    heap: bool = False
    heap_scope: str | None = None  # a file glob the heap samples keep to (None: all)
    max_pages: tuple[tuple[str, int], ...] = ()
    drain_timeout: float = 5.0  # seconds the final probe waits for the engine to idle

    @property
    def signals(self) -> frozenset:
        """What the run record carries: an engine's own probe, and the heap if asked."""
        from kvwatch.harness.run_record import Signal

        return frozenset({Signal.PROBES, Signal.SLOTS} | ({Signal.HEAP} if self.heap else set()))


KEYWORDS = frozenset(MarkerOptions.__dataclass_fields__)


def options_from_marker(args: tuple, kwargs: Mapping[str, Any]) -> MarkerOptions:
    """The marker's arguments as ``MarkerOptions``, or ``MarkerError``."""
    if args:
        raise MarkerError(f"@pytest.mark.{MARKER} takes keywords only, got {args!r}")
    unknown = sorted(set(kwargs) - KEYWORDS)
    if unknown:
        raise MarkerError(
            f"@pytest.mark.{MARKER}: unknown argument {', '.join(unknown)}; "
            f"it takes {', '.join(sorted(KEYWORDS))}"
        )
    probe = kwargs.get("probe", "engine")
    if not isinstance(probe, str) or not probe.isidentifier():
        raise MarkerError(f"@pytest.mark.{MARKER}: probe= names a fixture, got {probe!r}")
    warmup, heap = kwargs.get("warmup", 2), bool(kwargs.get("heap", False))
    if not isinstance(warmup, int) or warmup < 0:
        raise MarkerError(f"@pytest.mark.{MARKER}: warmup= is a count >= 0, got {warmup!r}")
    drain_timeout = kwargs.get("drain_timeout", 5.0)
    if not isinstance(drain_timeout, int | float) or drain_timeout <= 0:
        raise MarkerError(
            f"@pytest.mark.{MARKER}: drain_timeout= is seconds > 0, got {drain_timeout!r}"
        )
    return MarkerOptions(
        probe=probe,
        detectors=_detectors(kwargs.get("detectors"), heap),
        warmup=warmup,
        heap=heap,
        heap_scope=kwargs.get("heap_scope"),
        max_pages=_max_pages(kwargs.get("max_pages")),
        drain_timeout=float(drain_timeout),
    )


def _detectors(asked: Any, heap: bool) -> tuple[str, ...]:
    """The ids asked for (default: every detector an engine's probe feeds), ``heap``
    added when ``heap`` is set, checked against the registry."""
    from kvwatch.gate.verdicts.detectors import detector_set, for_signals

    signals = MarkerOptions(heap=heap).signals
    if asked is None:
        ids = for_signals(MarkerOptions().signals)
    elif isinstance(asked, str) or not all(isinstance(a, str) for a in asked):
        raise MarkerError(f"@pytest.mark.{MARKER}: detectors= is a tuple of ids, got {asked!r}")
    else:
        ids = tuple(asked)
    if heap and "heap" not in ids:
        ids += ("heap",)
    try:
        return detector_set(signals, only=ids).ids
    except ValueError as exc:
        raise MarkerError(f"@pytest.mark.{MARKER}(detectors=...): {exc}") from None


def _max_pages(asked: Any) -> tuple[tuple[str, int], ...]:
    if asked is None:
        return ()
    if not isinstance(asked, Mapping) or not all(
        isinstance(g, str) and isinstance(n, int) and n >= 0 for g, n in asked.items()
    ):
        raise MarkerError(
            f"@pytest.mark.{MARKER}: max_pages= maps a group to its most pages, "
            f'e.g. {{"full.kv": 512}}; got {asked!r}'
        )
    return tuple(sorted(asked.items()))


class ProbeTarget(NamedTuple):
    """What the probe fixture's value gives the gate: the probe, and the flush that
    runs before the final probe (None: cached pages count as held after the test)."""

    probe: Callable[[], Any]
    flush: Callable[[], object] | None


def probe_target(name: str, value: Any) -> ProbeTarget:
    """An object with ``probe()`` (and ``flush_cache()``, as an ``Engine`` has), or a
    callable returning a probe report or its JSON."""
    probe = getattr(value, "probe", None)
    if callable(probe):
        flush = getattr(value, "flush_cache", None)
        return ProbeTarget(probe=probe, flush=flush if callable(flush) else None)
    if callable(value):
        return ProbeTarget(probe=value, flush=None)
    raise MarkerError(
        f"@pytest.mark.{MARKER}(probe={name!r}): the fixture's value "
        f"({type(value).__name__}) is neither callable nor an object with a probe() method"
    )
