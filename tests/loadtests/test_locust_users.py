"""The Locust users against ``kvwatch serve``: Locust runs headless in its own process."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest
from paths import PACKAGE
from serverproc import TOKEN, kvwatch_server, wait_idle

pytestmark = pytest.mark.e2e

LOCUSTFILE = PACKAGE / "loadtests" / "locustfile.py"


def test_streaming_users_report_ttft_and_itl_and_close_their_sessions(tmp_path):
    with kvwatch_server("--enable-probe", "--probe-token", TOKEN) as url:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "locust",
                "-f",
                str(LOCUSTFILE),
                "--headless",
                "-u",
                "3",
                "-r",
                "3",
                "-t",
                "5s",
                "--host",
                url,
                "--csv",
                str(tmp_path / "stats"),
                "--only-summary",
                "--stop-timeout",
                "10",
                "ChatUser",
                "SessionAgent",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        rows = {
            (r["Type"], r["Name"]): r for r in csv.DictReader((tmp_path / "stats_stats.csv").open())
        }
        for kind in ("TTFT", "ITL"):
            assert int(rows[kind, "chat"]["Request Count"]) > 0
            assert int(rows[kind, "session turn"]["Request Count"]) > 0
        assert sum(int(r["Failure Count"]) for r in rows.values()) == 0
        report = wait_idle(url)
        assert report["live_sessions"] == 0 and report["findings"] == []  # closed on stop
