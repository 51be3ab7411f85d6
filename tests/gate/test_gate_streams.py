"""A reader that leaves never turns a failing gate into a pass.

``kvwatch gate ... | head -n 1`` closes the pipe after one line; the gate
must still run to its end, write ``summary.json`` and the JUnit file, and
exit with its own code. Results (each run's line, its failures, the
verdict) go to stdout and progress to stderr, so ``kvwatch gate > log``
keeps the verdict.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest

from kvwatch import streams


def test_lines_to_a_closed_pipe_are_dropped_and_the_exit_code_stands():
    """Thousands of lines into ``head -n 1``: no traceback, no exit 120 from
    Python's flush at exit, the program's own code (7) comes through."""
    program = (
        "import sys\n"
        "from kvwatch import streams\n"
        "for i in range(5000):\n"
        "    streams.out(f'line {i}')\n"
        "    streams.err(f'progress {i}')\n"
        "streams.settle()\n"
        "sys.exit(7)\n"
    )
    script = f"{shlex.quote(sys.executable)} -c {shlex.quote(program)} 2>&1 | head -n 1"
    done = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {script}"], capture_output=True, text=True
    )
    assert done.returncode == 7, done
    assert done.stdout in ("line 0\n", "progress 0\n"), done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_a_stream_without_a_reader_is_remembered(monkeypatch):
    class Gone:
        def write(self, text):
            raise BrokenPipeError

        def flush(self):
            raise BrokenPipeError

    monkeypatch.setattr(sys, "stdout", Gone())
    monkeypatch.setattr(streams, "_gone", set())
    streams.out("lost")
    assert streams.closed("stdout") and not streams.closed("stderr")
    streams.out("dropped without a write")  # the stand-in for /dev/null takes it


LEAK = ("--profile", "streaming-session", "-c", "1", "--inject", "session-tail-leak")


@pytest.mark.e2e
@pytest.mark.parametrize(
    "redirect",
    [
        "2>&1 | head -n 1",  # both streams lose their reader after one line
        "2> >(head -n 1 >/dev/null) > {log}",  # results kept in a file, progress cut short
    ],
)
def test_a_failing_gate_whose_reader_left_exits_1_with_its_outputs_written(tmp_path, redirect):
    out, junit, log = tmp_path / "out", tmp_path / "junit.xml", tmp_path / "gate.log"
    cmd = [sys.executable, "-m", "kvwatch", "gate", "--out", str(out), "--junit", str(junit)]
    cmd += [*LEAK, "--max-replays", "4", "--no-report"]
    line = f"set -o pipefail; {shlex.join(cmd)} {redirect.format(log=shlex.quote(str(log)))}"
    done = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=1200)
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr[-2000:])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["verdict"] == "fail" and summary["detectors"]["allocator"] == "fail"
    assert "<failure" in junit.read_text()
    if "{log}" in redirect:
        printed = log.read_text()
        assert "streaming-session c=1: " in printed  # the run's result line
        assert "FAIL allocator" in printed and "verdict: fail" in printed.splitlines()[-1]
        assert not re.search(r"turn \d+: \d+ conversations", printed)  # progress went to stderr
    else:
        assert len(done.stdout.splitlines()) == 1


def test_results_and_progress_go_to_their_own_streams():
    """The console's split, without a gate: a run's result is told, its progress said."""
    from kvwatch.gate.outputs import console
    from kvwatch.gate.verdicts import judge as verdicts
    from kvwatch.gate.verdicts.detectors.verdict import Evidence, fail
    from kvwatch.harness.progress import Progress

    said, told = [], []
    progress = Progress([("p", 1)], said.append, tell=told.append)
    progress.run_started("p", 1)
    leak = fail("allocator", 2, [Evidence(group="full.kv", pages=(), detail="full.kv: 3 leaked")])
    console.told(
        progress,
        verdicts.RunResult(
            profile="p",
            concurrency=1,
            turns=6,
            requests=9,
            errors=0,
            verdicts={"allocator": leak},
        ),
    )
    assert said == ["[1/1] p c=1 (0s elapsed)"]
    assert told == [
        "p c=1: 9 requests, 0 failed",
        "    FAIL allocator at turn 2: full.kv: 3 leaked",
    ]
