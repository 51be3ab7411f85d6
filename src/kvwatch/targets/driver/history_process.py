"""A driver process that plays histories for a target whose engine runs apart from kvwatch.

vLLM runs in its own Python, LightLLM's checkout changes torch and the import
system for the process that imports it: their history targets keep one
process that plays every history (``<engine>/history_driver.py``, the same
player over the engine's loop) and speak JSON lines with it::

    HistoryProcess.opened(command, env)      the process, for as long as the block lasts
    play(setup, history) -> PlayedOn          {"setup", "history"} in; {"played", "unasked"}
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

from kvwatch.targets.driver.history_target import PlayedOn

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

    def play(self, setup: dict[str, Any], history) -> PlayedOn:
        from kvwatch.histories.played_json import played_from_json

        if self.process is None:
            raise RuntimeError(f"{self.name} plays histories only inside opened()")
        request = {"setup": setup, "history": history.to_json()}
        self.process.stdin.write(json.dumps(request) + "\n")  # type: ignore[union-attr]
        self.process.stdin.flush()  # type: ignore[union-attr]
        data = json.loads(self._answer())
        if "unsupported" in data:
            raise Unsupported(data["unsupported"])
        if "error" in data:
            raise RuntimeError(f"{self.name} could not play it: {data['error']}")
        return PlayedOn(played_from_json(data["played"]), data["unasked"])

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
