"""Frozen configuration records for the engine.

Every record validates itself in ``__post_init__`` and raises ``ValueError`` with a
message that names the offending field, so a bad CLI flag or config file fails
before any tensor is allocated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import StrEnum

FULL_KV = "full.kv"
SWA_KV = "swa.kv"
SWA_WINDOW = "swa.window"
LINEAR_STATE = "linear.state"

GROUP_NAMES = (FULL_KV, SWA_KV, SWA_WINDOW, LINEAR_STATE)
STATE_GROUPS = (SWA_WINDOW, LINEAR_STATE)

# How many assistant steps a session can roll back. A session slot keeps this
# many turn-end snapshots plus the current one, and session records keep the
# routed-expert blobs of as many records: O(1) per session, whatever its turns.
MAX_ROLLBACK = 1


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


@dataclass(frozen=True)
class FailpointConfig:
    """Allocation failures on purpose, at every site of ``cache/failpoints.py``.

    Each site fails its hit number k, then every N-th hit after, with k drawn
    from [1, ``first``] and N from [``every``, 2 * ``every``] by ``seed`` and
    the site's name: a site hit ``first`` times has failed, and no site fails
    two hits in a row. ``sites`` limits the failures to those sites (empty:
    all of them). A testing aid; ``CacheConfig.failpoints`` is off (None) by default.
    """

    seed: int = 0
    first: int = 2
    every: int = 32
    sites: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        from kvwatch.engine.cache.failpoints import parse_sites

        object.__setattr__(self, "sites", parse_sites(self.sites))
        if self.first < 1:
            raise ValueError(f"failpoints.first must be >= 1, got {self.first}")
        if self.every < 2:
            raise ValueError(f"failpoints.every must be >= 2, got {self.every}")


class PrefixCacheMode(StrEnum):
    RADIX = "radix"  # the hybrid radix tree with state recovery
    SLOTS = "slots"  # a few whole-state snapshot slots, llama.cpp style (seed 004)
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
    full_kv: GroupSpec = field(
        default_factory=lambda: GroupSpec(name=FULL_KV, page_size=16, capacity=2048)
    )
    swa_kv: GroupSpec = field(
        default_factory=lambda: GroupSpec(name=SWA_KV, page_size=16, capacity=512)
    )
    swa_window: GroupSpec = field(
        default_factory=lambda: GroupSpec(
            name=SWA_WINDOW, page_size=32, capacity=64, host_capacity=64
        )
    )
    linear_state: GroupSpec = field(
        default_factory=lambda: GroupSpec(
            name=LINEAR_STATE, page_size=1, capacity=64, host_capacity=64
        )
    )
    mode: PrefixCacheMode = PrefixCacheMode.RADIX
    # ``slots`` mode: how many whole-state snapshot slots, and the shortest turn
    # boundary worth a snapshot (a shorter one is degenerate: its snapshot aborts).
    slots: int = 2
    slot_min_tokens: int = 32
    # Fail allocations on a schedule, so failure paths run on purpose (None: off).
    failpoints: FailpointConfig | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "mode", PrefixCacheMode(self.mode))
        except ValueError:
            modes = ", ".join(m.value for m in PrefixCacheMode)
            raise ValueError(
                f"unknown prefix cache mode {self.mode!r}; modes are {modes}"
            ) from None
        if self.slots < 1:
            raise ValueError(f"slots must be >= 1, got {self.slots}")
        if self.slot_min_tokens < 1:
            raise ValueError(f"slot_min_tokens must be >= 1, got {self.slot_min_tokens}")
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

    @classmethod
    def sized(cls, full: int, swa: int, state: int, host: int, **kw) -> CacheConfig:
        """The default geometry with these capacities (pages): ``full`` for full.kv,
        ``swa`` for swa.kv, ``state`` and ``host`` (host tier) for both state groups."""
        base = cls(**kw)
        return replace(
            base,
            full_kv=replace(base.full_kv, capacity=full),
            swa_kv=replace(base.swa_kv, capacity=swa),
            swa_window=replace(base.swa_window, capacity=state, host_capacity=host),
            linear_state=replace(base.linear_state, capacity=state, host_capacity=host),
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


@dataclass(frozen=True)
class ModelConfig:
    """The tiny hybrid decoder. Weights are random from ``seed``; nothing is downloaded.

    ``layers`` spells the layer pattern: ``F`` full attention, ``S`` sliding
    window attention (window from ``CacheConfig.window``), ``L`` linear
    attention. Every layer has an MoE feed-forward block with top-k routing.
    ``float64`` on CPU keeps greedy outputs the same under any batching and
    chunking, which the equivalence tests rely on.
    """

    layers: str = "FSLF"
    d_model: int = 64
    n_heads: int = 4
    head_dim: int = 16
    n_experts: int = 4
    top_k: int = 2
    expert_hidden: int = 96
    rope_theta: float = 10000.0
    max_model_len: int = 4096
    seed: int = 0
    dtype: str = "float64"

    def __post_init__(self) -> None:
        if not self.layers or set(self.layers) - set("FSL"):
            raise ValueError(f"layers must be a string of F, S and L, got {self.layers!r}")
        for kind in "FSL":
            if kind not in self.layers:
                raise ValueError(f"layers {self.layers!r} needs at least one {kind} layer")
        for name in (
            "d_model",
            "n_heads",
            "head_dim",
            "n_experts",
            "expert_hidden",
            "max_model_len",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"top_k must be in [1, n_experts={self.n_experts}], got {self.top_k}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.dtype not in ("float64", "float32"):
            raise ValueError(f"dtype must be float64 or float32, got {self.dtype!r}")

    def count(self, kind: str) -> int:
        return self.layers.count(kind)


@dataclass(frozen=True)
class SpecConfig:
    """Speculative decoding by n-gram prompt lookup (greedy requests only)."""

    num_drafts: int = 4  # k: drafts proposed per step; k + 1 slots are allocated
    min_ngram: int = 1
    max_ngram: int = 3

    def __post_init__(self) -> None:
        if self.num_drafts < 1:
            raise ValueError(f"num_drafts must be >= 1, got {self.num_drafts}")
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(
                f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}..{self.max_ngram}"
            )


@dataclass(frozen=True)
class SchedulerConfig:
    max_running: int = 16  # requests in one batch
    max_batch_tokens: int = 512  # tokens computed in one step, all requests together
    chunk_size: int = 64  # largest prefill chunk of one request in one step
    spec: SpecConfig | None = None
    retract_backoff: int = 2  # steps a retracted request waits before re-admission
    # A queued request that shares a prefix with one still computing it waits
    # for it and resumes where it branches off (prefix_wait.py).
    prefix_waits: bool = True
    # Testing aid: every this many steps, push one running request out as pool
    # pressure would (0 = never), so retraction and recovery run under any load.
    retract_every: int = 0

    def __post_init__(self) -> None:
        if self.retract_every < 0:
            raise ValueError(f"retract_every must be >= 0, got {self.retract_every}")
        if self.retract_backoff < 0:
            raise ValueError(f"retract_backoff must be >= 0, got {self.retract_backoff}")
        if self.max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {self.max_running}")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")
        spec_tokens = self.spec.num_drafts + 1 if self.spec else 1
        if self.max_batch_tokens < max(self.chunk_size, spec_tokens):
            raise ValueError(
                f"max_batch_tokens ({self.max_batch_tokens}) must fit one chunk "
                f"({self.chunk_size}) and one verify step ({spec_tokens})"
            )


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    device: str = "cpu"
    # torch intra-op threads on CPU. The model's ops are tiny, and spreading
    # them over threads costs far more than it saves; 0 leaves torch's default.
    cpu_threads: int = 1
    faults: frozenset = frozenset()

    def __post_init__(self) -> None:
        from kvwatch.engine.faults import parse_faults

        object.__setattr__(self, "faults", parse_faults(self.faults))
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be cpu or cuda, got {self.device!r}")
        if self.cpu_threads < 0:
            raise ValueError(f"cpu_threads must be >= 0, got {self.cpu_threads}")
