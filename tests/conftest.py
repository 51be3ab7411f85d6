"""Suite-wide settings.

torch's intra-op threads cost far more than they save on the tiny tensors of
the cache and the reference model (an Engine sets this for itself too); one
thread for the whole session keeps test times independent of test order.

Hypothesis runs every property test with a fixed derandomised seed, no
per-example deadline and no too-slow health check: a loaded machine must not
turn a slow example into a failure, and a run is the same run again.
``HYPOTHESIS_PROFILE=explore`` draws fresh examples instead.

Tests run on both cores with pytest-xdist, a file at a time (module-scoped
servers and the mutation matrix are built once). The scheduler hands files
out in collection order, so the long ones (``slow``, then ``e2e``) are put
first: a long file that starts last would leave one core idle at the end.
"""

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

torch.set_num_threads(1)

_QUIET = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.register_profile("ci", derandomize=True, database=None, **_QUIET)
settings.register_profile("explore", **_QUIET)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _weight(item: pytest.Item) -> int:
    if item.get_closest_marker("slow"):
        return 0
    if item.get_closest_marker("e2e"):
        return 1
    return 2


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_weight)  # stable: file order holds within each weight
