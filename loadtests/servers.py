"""Child processes of a gate run: ``kvwatch serve`` and Locust (master, workers).

Each runs as its own process (the engine never shares one with gevent),
bound to loopback on a free port, with its output in a log file under OUT.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

import kvwatch.loadtests

LOCUSTFILE = Path(kvwatch.loadtests.__file__).parent / "locustfile.py"
START_TIMEOUT = 90.0


class ServerError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EngineServer:
    """``kvwatch serve --enable-probe`` with an engine config file, until ``stop``."""

    def __init__(self, config: Path, faults: tuple[str, ...], log: Path, run_dir: Path) -> None:
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            *(sys.executable, "-m", "kvwatch", "serve", "--port", str(self.port)),
            *("--config", str(config), "--enable-probe", f"--probe-token={self.token}"),
            *("--run-dir", str(run_dir)),
            *(a for f in faults for a in ("--inject", f)),
        ]
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = log
        self._log = log.open("w")
        env = {**os.environ, "KVWATCH_FAULTS": ""}  # exactly the faults asked for
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self._wait_ready()

    def _wait_ready(self) -> None:
        try:
            wait_healthy(self.url, self.proc, START_TIMEOUT)
        except ServerError as exc:
            self.stop()
            raise ServerError(f"{exc}: {self.log.read_text()[-1500:]}") from None

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
        self._log.close()

    def __enter__(self) -> EngineServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float) -> None:
    """Until ``url/health`` answers 200; ServerError if the process exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerError(f"kvwatch serve exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise ServerError(f"kvwatch serve did not come up in {timeout:.0f} s")


def stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def locust_commands(
    user: str | tuple[str, ...],
    concurrency: int,
    host: str,
    plan: Path,
    out: Path,
    workers: int,
    timeout: float,
    *,
    stop_timeout: float = 0.0,
) -> list[list[str]]:
    """The Locust command lines of one run: the runner (or master) first, then workers.

    ``timeout`` is Locust's run time; ``stop_timeout`` lets each user finish the
    task it is in (and its ``on_stop``) when that time is up.
    """
    users = (user,) if isinstance(user, str) else tuple(user)
    base = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--kvwatch-plan", str(plan)]
    main = [
        *base,
        *("--headless", "-u", str(concurrency), "-r", str(concurrency), "--host", host),
        *("--csv", str(out / "locust"), "--html", str(out / "locust.html")),
        *("--exit-code-on-error", "0", "--only-summary", "--loglevel", "WARNING"),
        *("-t", f"{int(timeout)}s"),
        *(("--stop-timeout", f"{int(stop_timeout)}s") if stop_timeout else ()),
    ]
    if not workers:
        return [[*main, *users]]
    port = free_port()
    master = [
        *main,
        *("--master", "--expect-workers", str(workers)),
        *("--master-bind-host", "127.0.0.1", "--master-bind-port", str(port)),
        *users,
    ]
    worker = [
        *base,
        *("--worker", "--master-host", "127.0.0.1", "--master-port", str(port)),
        *("--loglevel", "WARNING", *users),
    ]
    return [master, *[worker] * workers]
