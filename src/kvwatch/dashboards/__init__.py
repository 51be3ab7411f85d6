"""kvwatch dashboards as code: built with grafana-foundation-sdk from the
metric names in ``kvwatch.instrumentation.names``, rendered to the committed
JSON in ``json/``, pushed with grafana-client."""

from __future__ import annotations

from kvwatch.dashboards import leak_gate, pools, serving

# uid -> builder; the order is the order they are pushed and listed
DASHBOARDS = {m.UID: m.build for m in (pools, serving, leak_gate)}

__all__ = ["DASHBOARDS"]
