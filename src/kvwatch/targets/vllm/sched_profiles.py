"""Every profile of ``--engine vllm-scheduler``, by name: the driver's and the gate's one list.

``workloads.py`` (``priority``, ``streaming-input``, ``waves``: one
full-attention group), ``layout_workloads.py`` (``mid-block-prefix``,
``hybrid-swa``, ``hybrid-mamba``, ``kv-events``: the layouts of
``kv_layout.py``), ``mixed_load.py`` (``mixed``: the hunt's seeded load,
in any layout). Invariant: names are unique across the three.
"""

from __future__ import annotations

from kvwatch.targets.vllm.layout_workloads import LAYOUT_WORKLOADS
from kvwatch.targets.vllm.mixed_load import MIXED_WORKLOADS
from kvwatch.targets.vllm.workloads import WORKLOADS as PLAIN
from kvwatch.targets.vllm.workloads import Workload

WORKLOADS: dict[str, type[Workload]] = {**PLAIN, **LAYOUT_WORKLOADS, **MIXED_WORKLOADS}
assert len(WORKLOADS) == len(PLAIN) + len(LAYOUT_WORKLOADS) + len(MIXED_WORKLOADS)
