"""vLLM's own scheduler as a ``HistoryTarget``: a release driven in its own Python, by setup.

vLLM runs only in its own venv, so the histories play there: ``opened()``
starts one driver process (``histories/driver_process.py``, with this
target's factory ``history_core.make_loop``) with the release's Python
(``release.find``: its venv, or its wheel unpacked over ``.venv-vllm``), and
``answer`` sends it each history and reads back what was played (plain JSON,
``histories/played_json.py``); the judging, shrinking and saving stay here::

    VllmHistoryTarget.answer(history) --{"setup", "history"}--> driver_process (vLLM's Python)
        history_core.make_loop: fresh Scheduler (scheduler_build) -> HistoryCore -> play
    <--{"played", "unasked"}-- judged by histories.checks as any target's

``SETUPS`` are the options users turn on, sized so generated histories run
into them (a pool that holds two or three requests, so preemption is common):

``plain``         one full-attention group of 16-token blocks, first come first served
``async``         the same with two steps in flight (``--async-scheduling``, vLLM's
                  default on GPUs)
``priority``      ``--scheduling-policy priority`` with two steps in flight: arrivals of
                  higher priority preempt running requests
``events``        ``--kv-events-config`` on: every KV event batch checked against the
                  pool after the step that published it (the audit's event ledger)
``hybrid-swa``    full attention and a 32-token sliding window in one pool
``mamba-align``   full attention and a Mamba group (``mamba_cache_mode=align``), 64-token
                  blocks hashed every 16 tokens (``prefix_match_unit``): partial-block
                  entries and hits inside a block
``streaming``     streaming-input sessions (``AsyncLLM.generate`` with an input generator:
                  a turn is a chunk under the session's request id), events on
``streaming-async``   the same with two steps in flight
``streaming-mamba``   the same in the ``mamba-align`` layout
``long-prefill``, ``watermark``, ``prefill-interval``, ``active-seqs``
                  ``plain`` with one scheduler option users set:
                  ``--long-prefill-token-threshold 24``, ``--watermark 0.1``,
                  ``--prefill-schedule-interval 3``, ``--max-num-active-seqs 2``
``no-full-isl``   ``streaming`` without ``--scheduler-reserve-full-isl`` (admission
                  checks only the first chunk fits)

The content check reads each ``Request``'s tokens (a session turn's: its
chunk's prompt at its first schedule, and what the caller received), and the
hits check the tokens a first schedule found computed. vLLM names no request in its block references and
tells its index through events the audit already checks after every step,
so the ``index`` and ``references`` checks are skipped, and there is no
cache-off engine for ``equivalence``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvwatch.targets.driver.history_process import HistoryProcess, Unsupported
from kvwatch.targets.driver.history_target import ProcessHistoryTarget, Shape
from kvwatch.targets.vllm.kv_layout import Layout
from kvwatch.targets.vllm.release import Release, find

DRIVER = "kvwatch.histories.driver_process"
FACTORY = "kvwatch.targets.vllm.history_core:make_loop"
NEWEST = "0.33.0"
PYTHON_ENV = "KVWATCH_VLLM_PYTHON"
# quiet, and a GPU build's scheduler on CPU
VLLM_ENV = {"VLLM_LOGGING_LEVEL": "WARNING", "VLLM_TARGET_DEVICE": "cpu"}
CONTEXT = 256


class Unavailable(RuntimeError):
    """The release cannot play this setup here (no such vLLM, or a layout it lacks)."""


@dataclass(frozen=True)
class VllmSetup:
    """A scheduler the driver builds for each history (``scheduler_build.build``)."""

    num_blocks: int
    budget: int = 64  # tokens a step: prompts longer than this are chunked
    context: int = CONTEXT
    policy: str = "fcfs"
    in_flight: int = 1
    layout: Layout = field(default_factory=Layout)
    sessions: bool = False  # streaming-input sessions (``AsyncLLM``'s input generator)
    # further config fields users set: {"scheduler": {...}, "cache": {...}}
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "num_blocks": self.num_blocks,
            "block_size": self.layout.block_size,
            "budget": self.budget,
            "context": self.context,
            "policy": self.policy,
            "in_flight": self.in_flight,
            "layout": self.layout.to_json(),
            "options": {part: dict(fields) for part, fields in self.options.items()},
        }


def _sched(**fields: Any) -> dict[str, dict[str, Any]]:
    return {"scheduler": fields}


MAMBA_ALIGN = Layout(groups=("full", "mamba"), block_size=64, prefix_match_unit=16, events=True)
SETUPS: dict[str, VllmSetup] = {
    "plain": VllmSetup(num_blocks=20),
    "async": VllmSetup(num_blocks=20, in_flight=2),
    "priority": VllmSetup(num_blocks=20, policy="priority", in_flight=2),
    "events": VllmSetup(num_blocks=20, layout=Layout(events=True)),
    "hybrid-swa": VllmSetup(num_blocks=60, layout=Layout(groups=("full", "swa"), events=True)),
    "mamba-align": VllmSetup(num_blocks=30, layout=MAMBA_ALIGN),
    "streaming": VllmSetup(num_blocks=24, sessions=True, layout=Layout(events=True)),
    "streaming-async": VllmSetup(num_blocks=24, sessions=True, in_flight=2),
    "streaming-mamba": VllmSetup(num_blocks=30, sessions=True, layout=MAMBA_ALIGN),
    # one scheduler option each, as users set them
    "long-prefill": VllmSetup(num_blocks=20, options=_sched(long_prefill_token_threshold=24)),
    "watermark": VllmSetup(num_blocks=20, options=_sched(watermark=0.1)),
    "prefill-interval": VllmSetup(num_blocks=20, options=_sched(prefill_schedule_interval=3)),
    "active-seqs": VllmSetup(num_blocks=20, options=_sched(max_num_active_seqs=2)),
    "no-full-isl": VllmSetup(
        num_blocks=20, sessions=True, options=_sched(scheduler_reserve_full_isl=False)
    ),
}


def default_python() -> str:
    """``$KVWATCH_VLLM_PYTHON``, else ``.venv-vllm`` (``make test-vllm``) here."""
    return os.environ.get(PYTHON_ENV) or str(Path(".venv-vllm/bin/python").absolute())


class VllmHistoryTarget(ProcessHistoryTarget):
    engine = "vllm"

    def __init__(
        self, version: str = NEWEST, setup: str = "plain", python: str | None = None
    ) -> None:
        if setup not in SETUPS:
            raise ValueError(f"no vLLM setup {setup!r}; setups: {', '.join(SETUPS)}")
        self.version, self.setup, self.config = version, setup, SETUPS[setup]
        python = python or default_python()
        if not Path(python).exists():
            raise Unavailable(f"no vLLM Python at {python} (make test-vllm, or ${PYTHON_ENV})")
        try:
            self.release: Release = find(version, python)
        except ValueError as exc:
            raise Unavailable(str(exc)) from None
        layout = self.config.layout
        self.shape = Shape(
            engine=self.engine,
            page=layout.prefix_match_unit or layout.block_size,
            chunk=self.config.budget,
            context=self.config.context,
            unit=layout.block_size if layout.fine else 0,
            vocab=(32, 2000),
            sessions=self.config.sessions,
            priorities=self.config.policy == "priority",
        )
        self.driver = HistoryProcess("vLLM's history driver")

    @contextlib.contextmanager
    def opened(self) -> Iterator[None]:
        """One driver process in the release's Python for every history played inside."""
        with tempfile.TemporaryDirectory(prefix="kvwatch-vllm-model-") as model:
            command = [self.release.python, "-P", "-m", DRIVER, FACTORY, model]
            env = {**os.environ, **self.release.env(), **VLLM_ENV}
            with self.driver.opened(command, env):
                yield

    def answer(self, history: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.driver.answer(self.config.to_json(), history)
        except Unsupported as exc:
            raise Unavailable(f"vLLM {self.version}: {exc}") from None

    def describe(self) -> dict[str, Any]:
        return {"engine": self.engine, "version": self.version, "setup": self.setup}
