"""The README's server quickstart, run as written: start ``kvwatch serve`` in the
background, wait in the readiness loop, stream a chat completion with the
official ``openai`` client, read ``/metrics`` and the probe, stop the server.

The only change to the block is the port: a free one instead of 8000, so the
test never meets a server someone else left on 8000. ``bash -e`` stops at the
first command that fails, and a trap then stops the server.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from paths import REPO

from kvwatch.processes import free_port

pytestmark = pytest.mark.e2e

README = REPO / "README.md"
# A hang guard only: on a quiet machine the block ends in well under a minute.
BLOCK_TIMEOUT_S = 300


def quickstart() -> str:
    """The first code block under the README's "The server" heading."""
    text = README.read_text()
    after = text[text.index("\n## The server\n") :]
    return re.search(r"^```\n(.*?)^```", after, flags=re.S | re.M)[1]


def test_the_quickstart_block_waits_for_readiness_and_stops_its_server():
    block = quickstart()
    first, loop = block.splitlines()[:2]
    assert first == "kvwatch serve --enable-probe --port 8000 &"
    assert loop.startswith("until curl -sf 127.0.0.1:8000/health ")
    assert block.rstrip().endswith("kill %1")


@pytest.mark.skipif(shutil.which("curl") is None, reason="the quickstart uses curl")
def test_the_readme_quickstart_runs_as_written(tmp_path):
    port = free_port()
    # the trap stops the server when a line fails before the block's own `kill %1`
    script = f"cd {tmp_path}\ntrap 'kill %1 2>/dev/null' EXIT\n"
    script += quickstart().replace("8000", str(port))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("KVWATCH_FAULTS", None)
    proc = subprocess.Popen(
        ["bash", "-e", "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # the server it starts is in this group: stopped below
    )
    try:
        out, err = proc.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        stop_group(proc.pid)
        out, err = proc.communicate()
        pytest.fail(f"the block hung; it printed:\n{out[-2000:]}\n{err[-3000:]}")
    finally:
        stop_group(proc.pid)
    assert proc.returncode == 0, err
    lines = out.splitlines()
    assert any(line.startswith("kvwatch_pool_pages{") for line in lines), out
    report = json.loads(lines[-1])  # the probe, after the streamed chat completion
    assert report["step"] > 0 and report["live_requests"] == 0, report
    assert report["findings"] == []
    assert f"kvwatch serve: listening on http://127.0.0.1:{port}\n" in err
    assert "kvwatch serve: ready (kvwatch-tiny-hybrid on cpu, " in err


def stop_group(pgid: int) -> None:
    """SIGTERM to what is left of the block's process group, then SIGKILL after a
    grace period; returns once the group is gone."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.killpg(pgid, signal.SIGKILL)


def engine_example() -> str:
    """The first Python block under the README's "The engine in Python" heading."""
    text = README.read_text()
    after = text[text.index("\n## The engine in Python\n") :]
    return re.search(r"^```python\n(.*?)^```", after, flags=re.S | re.M)[1]


def test_the_engine_example_runs_as_written_and_its_follow_up_hits_the_cache():
    proc = subprocess.run(
        [sys.executable, "-c", engine_example()], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].endswith(" length"), lines[0]  # sixteen token ids, then the reason
    cached = int(lines[-1])
    promised = re.search(r"# (\d+): six 16-token pages", engine_example())
    assert cached == int(promised[1]) == 96  # the comment says what it prints


def cache_example() -> str:
    """The Python block under the README's "Using the cache directly" heading."""
    text = README.read_text()
    after = text[text.index("\n## Using the cache directly\n") :]
    return re.search(r"^```python\n(.*?)^```", after, flags=re.S | re.M)[1]


def test_the_cache_example_runs_as_written_and_finds_the_roots_ref():
    """The example plants the root-ref leak and promises a ref_mismatch on the root;
    the same lines without the fault find nothing."""
    example = cache_example()
    clean = example.replace("faults=frozenset({Fault.ROOT_REF_LEAK_ON_MISS})", "")
    assert clean != example
    found = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        for code in (example, clean)
    ]
    assert [p.returncode for p in found] == [0, 0], [p.stderr for p in found]
    assert "REF_MISMATCH" in found[0].stdout and "detail='root:" in found[0].stdout
    assert found[1].stdout.strip() == "()"
