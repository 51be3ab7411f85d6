"""The engine core publishes events; it never imports telemetry, load or dashboard code."""

from __future__ import annotations

import subprocess
import sys

FORBIDDEN = ("opentelemetry", "locust", "grafana_client", "grafana_foundation_sdk", "gevent")


def test_importing_the_engine_pulls_no_telemetry():
    code = (
        "import sys, pkgutil, importlib, kvwatch.engine as e\n"
        "for m in pkgutil.walk_packages(e.__path__, 'kvwatch.engine.'):\n"
        "    importlib.import_module(m.name)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"kvwatch.engine imported {out.stdout.strip()}"
