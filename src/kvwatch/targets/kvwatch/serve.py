"""``kvwatch serve`` as a child process of the gate: started on a free port, read back.

It runs as its own process (the engine never shares one with gevent), bound
to loopback, with its output in a log file under OUT. It is started with
``--port 0`` and binds a free port itself; the URL is read from the line it
prints once bound, so two servers started at once can never race for one
port.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

from kvwatch.processes import ServerError, stop, wait_healthy

# Building the engine takes seconds on a quiet machine; a loaded CI runner can
# take ten times that. Only an engine that never comes up should hit this.
START_TIMEOUT = 300.0
LISTENING = re.compile(r"kvwatch serve: listening on (http://\S+)")


def start_serve(
    flags: list[str], log: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, str]:
    """``kvwatch serve --port 0 FLAGS`` with its output in ``log``; the process and
    its URL once ``/health`` answers. ServerError (with the log's tail) if it
    exits or does not come up in ``START_TIMEOUT`` seconds; the process is
    stopped then."""
    cmd = [sys.executable, "-m", "kvwatch", "serve", "--port", "0", *flags]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        url = _announced_url(proc, log, deadline)
        wait_healthy(url, proc, deadline - time.monotonic())
    except ServerError as exc:
        stop(proc)
        raise ServerError(f"{exc}: {log.read_text(errors='replace')[-1500:]}") from None
    return proc, url


def _announced_url(proc: subprocess.Popen, log: Path, deadline: float) -> str:
    while time.monotonic() < deadline:
        if match := LISTENING.search(log.read_text(errors="replace")):
            return match[1]
        if proc.poll() is not None:
            raise ServerError(f"kvwatch serve exited with {proc.returncode}")
        time.sleep(0.1)
    raise ServerError(f"kvwatch serve did not bind a port in {START_TIMEOUT:.0f} s")


class EngineServer:
    """``kvwatch serve --enable-probe`` with an engine config file, until ``stop``."""

    def __init__(
        self,
        config: Path,
        faults: tuple[str, ...],
        log: Path,
        run_dir: Path,
        extra: tuple[str, ...] = (),
    ) -> None:
        """``extra``: further ``kvwatch serve`` flags (a profile's ``serve_flags``)."""
        self.token = secrets.token_hex(16)
        flags = [
            *("--config", str(config), "--enable-probe", f"--probe-token={self.token}"),
            *("--run-dir", str(run_dir)),
            *(a for f in faults for a in ("--inject", f)),
            *extra,
        ]
        self.log = log
        # exactly the faults asked for, whatever the environment says
        started = time.monotonic()
        self.proc, self.url = start_serve(flags, log, env={"KVWATCH_FAULTS": ""})
        self.start_s = time.monotonic() - started  # until it answered ready

    def exited(self) -> str | None:
        """None while the server runs; once it has exited, why (its code and last log lines)."""
        code = self.proc.poll()
        if code is None:
            return None
        how = f"killed by signal {-code}" if code < 0 else f"exited with {code}"
        tail = self.log.read_text(errors="replace").strip().splitlines()[-3:]
        last = f"; {self.log} ends: {' | '.join(tail)}" if tail else ""
        return f"kvwatch serve {how} during the run{last}"

    def stop(self) -> None:
        stop(self.proc)

    def __enter__(self) -> EngineServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
