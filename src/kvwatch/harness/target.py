"""The seam between the gate and what it gates.

A ``Target`` is everything the gate needs from the thing under test. The
gate defines it and never imports an implementation: those live in
``kvwatch.targets`` (kvwatch's engine, a black-box server, vLLM, ...), the
flags of ``kvwatch gate`` pick one, once (``targets/select.py``), and the
gate loop (``gate/pipeline.py``) knows nothing else about it::

    with target.started(progress):                   what every profile shares (vLLM)
        for profile in target.selected(names):
            with target.serving(profile, progress) as served:   a server per profile (kvwatch)
                for c in concurrencies:
                    record = served.run(RunSpec(...))         load, probes -> RunRecord
                    judged by the detectors its signals allow (gate/)

``signals`` say what the target's records carry (probes, heap samples,
replays, gauges, ...); which detectors judge it follows from them in one
place (``gate.verdicts.detectors.detector_set``). A target that cannot start
raises ``ServerError`` from ``started`` or ``serving``: the runs it would have
served are broken (exit 3), never passed.

The seam loads nothing that runs Locust: what a run and a soak are asked to
do are plain records (``specs.py``); the code that starts Locust
(``locust_run.py``, ``soak_load.py``) is imported by the targets that run it.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from typing import ClassVar, Protocol

from kvwatch.harness.progress import Progress
from kvwatch.harness.run_record import RunRecord, Signal
from kvwatch.harness.specs import RunSpec, SoakSpec

# the seam: what a target implements and what the gate hands it
__all__ = ["Profile", "RunSpec", "Served", "SoakSpec", "Target"]


class Profile(Protocol):
    """A load a target can run; the gate reads its name and its turns per run
    (used when ``--turns`` is not given)."""

    name: str
    turns: int


class Served(ABC):
    """A target serving one profile, for each of its runs."""

    @abstractmethod
    def run(self, spec: RunSpec) -> RunRecord:
        """Load, probe and record one run. A run that broke comes back with
        ``error`` set; one that left nothing to judge (its engine died, no record
        was written) has no turns as well."""

    def exited(self) -> str | None:
        """Why the engine behind it is gone, or None while it runs."""
        return None

    def soak(self, spec: SoakSpec) -> RunRecord:
        """Free-running load for ``spec.duration``, probed while it runs, then
        drained (``kvwatch gate --soak``): a record carrying ``specs.SOAK_SIGNALS``.
        Only a target whose ``soak_profile`` serves one is asked."""
        raise NotImplementedError(f"{type(self).__name__} does not soak")


class Target(ABC):
    name: ClassVar[str]  # summary.json's "target"
    signals: frozenset[Signal]  # what its run records carry
    faults: tuple[str, ...] = ()  # bugs planted in it for this gate
    # whether two profiles may be served at once: each on an engine of its own that
    # shares nothing with the other's (the gate's --jobs lanes); not where one
    # server serves every profile, as its runs would see each other's load
    independent_profiles: ClassVar[bool] = False

    @abstractmethod
    def profiles(self) -> Mapping[str, Profile]:
        """Every profile this target can run, in the order a gate runs them."""

    def selected(self, names: Sequence[str]) -> tuple[Profile, ...]:
        """The profiles ``names`` asks for (every one when empty); ValueError
        for a name this target cannot run."""
        known = self.profiles()
        if not names:
            return tuple(known.values())
        for name in names:
            if name not in known:
                raise ValueError(self.unknown_profile(name))
        return tuple(known[name] for name in names)

    def unknown_profile(self, name: str) -> str:
        return f"unknown profile {name!r}; profiles are {', '.join(self.profiles())}"

    def soak_profile(self, names: Sequence[str]) -> Profile:
        """The one profile a soak of ``names`` is served as (``serving`` takes it,
        and its ``Served.soak`` runs the load); ValueError where this target
        cannot soak them."""
        raise ValueError(f"--soak runs against kvwatch's own engine, not {self.name}")

    @contextlib.contextmanager
    def started(self, progress: Progress) -> Iterator[None]:
        """What every profile of the gate shares; nothing by default."""
        yield

    @abstractmethod
    def serving(
        self, profile: Profile, progress: Progress
    ) -> contextlib.AbstractContextManager[Served]:
        """``profile`` served until the block ends; ServerError if it cannot be."""
