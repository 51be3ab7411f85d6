"""Ctrl-C on ``kvwatch gate``: the finished runs are judged and written, marked
interrupted, every process the gate started is stopped, and it exits 130.

Ctrl-C in a terminal signals the whole foreground process group: the gate,
its server and its Locust processes at once; the test does the same."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline and int(pid) != os.getpid():
            found.append(f"{pid}: {cmdline[:200]}")
    return found


def interrupt(tmp_path, flags: list[str], at: str) -> tuple[str, str]:
    """``kvwatch gate FLAGS`` in a session of its own, Ctrl-C to the whole group two
    seconds after the progress line starting ``at`` (Locust is under way by then);
    its stdout and stderr once it exited 130, with no traceback."""
    cmd = [sys.executable, "-m", "kvwatch", "gate", "--out", str(tmp_path), *flags]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    lines = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if line.startswith(at):
                break
        assert lines and lines[-1].startswith(at), "".join(lines)[-3000:]
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGINT)
        out, rest = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = "".join(lines) + rest
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    return out, err


def nothing_left(tmp_path) -> None:
    """No process that names the gate's output folder is left (stopping is
    asynchronous for grandchildren)."""
    deadline = time.monotonic() + 30
    while (left := processes_mentioning(str(tmp_path))) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, left


def test_an_interrupted_gate_writes_a_partial_summary_and_exits_130(tmp_path):
    flags = ["--profile", "streaming-session", "-c", "1,8", "--max-replays", "2"]
    out, _ = interrupt(tmp_path, flags, at="[2/2]")  # the first run done, the second started
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["interrupted"] is True
    assert summary["verdict"] == "error"  # an unfinished gate is no pass
    assert [(r["profile"], r["concurrency"]) for r in summary["runs"]] == [("streaming-session", 1)]
    assert "interrupted" in out.splitlines()[-1], out  # the verdict is a result: stdout
    nothing_left(tmp_path)


def test_an_interrupted_gate_with_lanes_stops_every_lane(tmp_path):
    """Two profiles side by side: Ctrl-C stops both lanes' Locust and servers."""
    flags = ["--jobs", "2", "--profile", "bad-input", "--profile", "slot-cache", "-c", "1,8"]
    interrupt(tmp_path, [*flags, "--max-replays", "2"], at="[3/4]")  # a second run started
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["interrupted"] is True
    ran = [(r["profile"], r["concurrency"]) for r in summary["runs"]]
    plan = [("bad-input", 1), ("bad-input", 8), ("slot-cache", 1), ("slot-cache", 8)]
    assert ran and ran == [run for run in plan if run in ran], ran
    nothing_left(tmp_path)
