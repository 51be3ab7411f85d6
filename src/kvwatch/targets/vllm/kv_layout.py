"""The KV cache layout ``--engine vllm-scheduler`` gives vLLM's scheduler: its groups and knobs.

A ``Layout`` names what the driver builds (``kv_groups.py`` turns it into
vLLM's own specs and config, in vLLM's Python; this module imports nothing
from vLLM, so the gate and the hunt read and write layouts without it):

``groups``             the KV cache groups, in order: ``full`` (full attention,
                       always first), ``swa`` (sliding window of ``window``
                       tokens), ``mamba`` (a Mamba state group in cache mode
                       ``align``, the mode vLLM needs for prefix caching). More
                       than one group gives vLLM's ``HybridKVCacheCoordinator``
``block_size``         tokens per block of every group (``cache_config.block_size``)
``prefix_match_unit``  ``cache_config.prefix_match_unit`` (vLLM 0.26.0+): tokens
                       per prefix hash. Below ``block_size`` (only with several
                       groups: one group rejects it) a full-attention block
                       caches its prompt tail as a partial entry
                       (``BlockPool.cache_partial_block``), and with a Mamba
                       group hits land inside blocks; None: vLLM's own choice
                       (the GCD of the groups' block sizes)
``events``             ``kv_events_config.enable_kv_cache_events``: the block
                       pool queues ``BlockStored`` / ``BlockRemoved`` /
                       ``AllBlocksCleared``, the scheduler publishes them as a
                       ``KVEventBatch`` after each step (``event_ledger.py``
                       checks them)

Invariants: ``groups`` starts with ``full`` and names each kind at most once;
a unit, when set, divides ``block_size``. ``label`` is unique per layout and
``parse(label)`` gives the layout back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

KINDS = ("full", "swa", "mamba")


@dataclass(frozen=True, kw_only=True)
class Layout:
    """One KV cache layout (see the module docstring)."""

    groups: tuple[str, ...] = ("full",)
    block_size: int = 16
    prefix_match_unit: int | None = None
    window: int = 32
    events: bool = False

    def __post_init__(self) -> None:
        groups = tuple(self.groups)
        object.__setattr__(self, "groups", groups)
        if not groups or groups[0] != "full" or len(set(groups)) != len(groups):
            raise ValueError(f"groups {groups}: full attention first, each kind once")
        if unknown := set(groups) - set(KINDS):
            raise ValueError(f"unknown KV cache group kinds {sorted(unknown)} (know {KINDS})")
        unit = self.prefix_match_unit
        if unit is not None and (unit <= 0 or self.block_size % unit):
            raise ValueError(f"prefix_match_unit {unit} must divide block_size {self.block_size}")

    @property
    def hybrid(self) -> bool:
        return len(self.groups) > 1

    @property
    def fine(self) -> bool:
        """Whether prefix hashes are finer than the blocks (partial-block entries)."""
        return self.prefix_match_unit is not None and self.prefix_match_unit < self.block_size

    @property
    def label(self) -> str:
        """``full+mamba/b64/u16/events``: groups, block size, unit (if set), events (if on)."""
        parts = ["+".join(self.groups), f"b{self.block_size}"]
        parts += [f"u{self.prefix_match_unit}"] if self.prefix_match_unit else []
        parts += [f"w{self.window}"] if "swa" in self.groups else []
        parts += ["events"] if self.events else []
        return "/".join(parts)

    def to_json(self) -> dict:
        return {**asdict(self), "groups": list(self.groups)}

    def with_events(self, on: bool = True) -> Layout:
        return replace(self, events=on)


def from_json(data: dict | None) -> Layout:
    """The layout a plan carries (None: one full-attention group of 16-token blocks)."""
    if not data:
        return Layout()
    return Layout(**{**data, "groups": tuple(data.get("groups", ("full",)))})


def fit(settings: dict, layout: Layout, concurrency: int) -> dict:
    """A workload's scheduler settings in ``layout``: as many tokens per group as its
    pool had, in ``layout``'s blocks, plus a block per conversation for round-ups."""
    tokens = settings["num_blocks"] * settings["block_size"]
    per_group = -(-tokens // layout.block_size) + concurrency
    blocks = per_group * len(layout.groups) + 1
    return {**settings, "block_size": layout.block_size, "num_blocks": blocks, "layout": layout}


def parse(label: str) -> Layout:
    """``Layout.label``'s inverse: ``full+swa/b16/w32/events``."""
    head, *parts = label.split("/")
    fields: dict = {"groups": tuple(head.split("+"))}
    for part in parts:
        if part == "events":
            fields["events"] = True
        elif part[:1] in "buw" and part[1:].isdigit():
            name = {"b": "block_size", "u": "prefix_match_unit", "w": "window"}[part[0]]
            fields[name] = int(part[1:])
        else:
            raise ValueError(f"layout {label!r}: cannot read {part!r}")
    return Layout(**fields)
