"""Frozen configuration records for the engine.

Every record validates itself in ``__post_init__`` and raises ``ValueError`` with a
message that names the offending field, so a bad CLI flag or config file fails
before any tensor is allocated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

FULL_KV = "full.kv"
SWA_KV = "swa.kv"
SWA_WINDOW = "swa.window"
LINEAR_STATE = "linear.state"

GROUP_NAMES = (FULL_KV, SWA_KV, SWA_WINDOW, LINEAR_STATE)
STATE_GROUPS = (SWA_WINDOW, LINEAR_STATE)


class Family(StrEnum):
    """What a cache group holds.

    ``history`` groups hold per-token K/V; ``state`` groups hold continuation
    snapshots taken at node boundaries (one snapshot spans a fixed page count).
    """

    HISTORY = "history"
    STATE = "state"


GROUP_FAMILY = {
    FULL_KV: Family.HISTORY,
    SWA_KV: Family.HISTORY,
    SWA_WINDOW: Family.STATE,
    LINEAR_STATE: Family.STATE,
}


@dataclass(frozen=True)
class GroupSpec:
    """One cache group: its own page pool with its own page size and capacity.

    ``page_size`` counts tokens per page for ``full.kv``, ``swa.kv`` and
    ``swa.window``; a ``linear.state`` page holds one recurrent state, so its
    page size is 1. ``host_capacity`` sizes the host tier that retracted
    requests' recovery snapshots may move to (state groups only).
    """

    name: str
    page_size: int
    capacity: int
    host_capacity: int = 0

    def __post_init__(self) -> None:
        if self.name not in GROUP_FAMILY:
            raise ValueError(
                f"unknown cache group {self.name!r}; groups are {', '.join(GROUP_NAMES)}"
            )
        if self.page_size < 1:
            raise ValueError(f"{self.name}: page_size must be >= 1, got {self.page_size}")
        if self.capacity < 1:
            raise ValueError(f"{self.name}: capacity must be >= 1 page, got {self.capacity}")
        if self.host_capacity < 0:
            raise ValueError(f"{self.name}: host_capacity must be >= 0, got {self.host_capacity}")
        if self.family is Family.HISTORY and self.host_capacity:
            raise ValueError(f"{self.name}: only state groups have a host tier")
        if self.name == LINEAR_STATE and self.page_size != 1:
            raise ValueError(f"{LINEAR_STATE}: a page holds one state, so page_size must be 1")

    @property
    def family(self) -> Family:
        return GROUP_FAMILY[self.name]


class PrefixCacheMode(StrEnum):
    RADIX = "radix"
    OFF = "off"


@dataclass(frozen=True)
class CacheConfig:
    """Geometry of the hybrid prefix cache.

    ``window`` (W) is the sliding-window length of the S layers: a token at
    position p attends to keys in [p - W + 1, p], and a request keeps the last W
    positions of ``swa.kv``. ``snapshot_interval`` is the "big page": every
    multiple of it that a prefill crosses gets a continuation snapshot.
    """

    window: int = 32
    snapshot_interval: int = 64
    full_kv: GroupSpec = field(default_factory=lambda: GroupSpec(FULL_KV, 16, 2048))
    swa_kv: GroupSpec = field(default_factory=lambda: GroupSpec(SWA_KV, 16, 512))
    swa_window: GroupSpec = field(default_factory=lambda: GroupSpec(SWA_WINDOW, 32, 64, 64))
    linear_state: GroupSpec = field(default_factory=lambda: GroupSpec(LINEAR_STATE, 1, 64, 64))
    mode: PrefixCacheMode = PrefixCacheMode.RADIX

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", PrefixCacheMode(self.mode))
        for name, spec in zip(GROUP_NAMES, self.groups, strict=True):
            if spec.name != name:
                raise ValueError(f"CacheConfig slot for {name} holds group {spec.name!r}")
        if self.window < 1:
            raise ValueError(f"window must be >= 1 token, got {self.window}")
        p = self.page_size
        if self.snapshot_interval < p or self.snapshot_interval % p:
            raise ValueError(
                f"snapshot_interval ({self.snapshot_interval}) must be a positive multiple "
                f"of the {FULL_KV} page size ({p})"
            )
        if self.swa_kv.capacity < self.swa_pages_per_request:
            raise ValueError(
                f"{SWA_KV} capacity ({self.swa_kv.capacity}) cannot hold even one request's "
                f"window ({self.swa_pages_per_request} pages)"
            )
        for spec in (self.swa_window, self.linear_state):
            if spec.capacity < 2 * self.pages_per_snapshot(spec.name):
                raise ValueError(
                    f"{spec.name} capacity ({spec.capacity}) must hold at least a working "
                    f"state and one snapshot ({2 * self.pages_per_snapshot(spec.name)} pages)"
                )

    @property
    def page_size(self) -> int:
        """P: tokens per ``full.kv`` page; the radix tree is aligned to it."""
        return self.full_kv.page_size

    @property
    def groups(self) -> tuple[GroupSpec, ...]:
        return (self.full_kv, self.swa_kv, self.swa_window, self.linear_state)

    def group(self, name: str) -> GroupSpec:
        for spec in self.groups:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def pages_per_snapshot(self, name: str) -> int:
        """Pages one continuation snapshot takes in a state group."""
        if name == SWA_WINDOW:
            return math.ceil(self.window / self.swa_window.page_size)
        if name == LINEAR_STATE:
            return 1
        raise ValueError(f"{name} is not a state group")

    @property
    def swa_pages_per_request(self) -> int:
        """Upper bound on the ``swa.kv`` pages one request holds at once.

        The window plus one chunk boundary can straddle two extra pages.
        """
        return math.ceil(self.window / self.swa_kv.page_size) + 2
