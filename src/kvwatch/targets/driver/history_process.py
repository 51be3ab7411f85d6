"""A driver process that plays histories for a target whose engine runs apart from kvwatch.

vLLM runs in its own Python: its history target keeps one process that plays
every history (``histories/driver_process.py``, the same player over the
engine's loop, built by the target's factory) and speaks JSON lines with it::

    HistoryProcess.opened(command, env)      the process, for as long as the block lasts
    answer(setup, history) -> dict            {"setup", "history"} in; {"played", "unasked"}
                                              out (``histories/played_json.py``); an answer
                                              {"unsupported": why} raises Unsupported,
                                              {"error": why} RuntimeError

What the process prints goes to a log file, read back when it gives no answer.
"""

from __future__ import annotations

import contextlib
import json
import select
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

WAIT_S = 600  # one history's answer, at most: bounds a hung driver, never judges speed


class Unsupported(RuntimeError):
    """The engine cannot build the setup a history asked for."""


class HistoryProcess:
    def __init__(self, name: str) -> None:
        self.name = name  # how errors name it ("vLLM's history driver")
        self.process: subprocess.Popen | None = None
        self.log: IO[str] | None = None

    @contextlib.contextmanager
    def opened(self, command: Sequence[str], env: Mapping[str, str]) -> Iterator[None]:
        with tempfile.TemporaryDirectory(prefix="kvwatch-history-driver-") as tmp:
            self.log = open(Path(tmp) / "driver.log", "w+")  # noqa: SIM115 (read back on failure)
            self.process = subprocess.Popen(
                list(command),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.log,
                text=True,
                env=dict(env),
                cwd=tmp,
            )
            try:
                yield
            finally:
                process, self.process = self.process, None
                process.stdin.close()  # type: ignore[union-attr]
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
                self.log.close()

    def answer(self, setup: dict[str, Any], history: dict[str, Any]) -> dict[str, Any]:
        if self.process is None:
            raise RuntimeError(f"{self.name} plays histories only inside opened()")
        request = {"setup": setup, "history": history}
        self.process.stdin.write(json.dumps(request) + "\n")  # type: ignore[union-attr]
        self.process.stdin.flush()  # type: ignore[union-attr]
        data = json.loads(self._answer())
        if "unsupported" in data:
            raise Unsupported(data["unsupported"])
        if "error" in data:
            raise RuntimeError(f"{self.name} could not play it: {data['error']}")
        return data

    def _answer(self) -> str:
        out = self.process.stdout  # type: ignore[union-attr]
        ready, _, _ = select.select([out], [], [], WAIT_S)
        line = out.readline() if ready else ""
        if not line:
            assert self.log is not None
            self.log.flush()
            self.log.seek(0)
            tail = " | ".join(self.log.read().strip().splitlines()[-6:])
            raise RuntimeError(f"{self.name} gave no answer: {tail or 'no output'}")
        return line
