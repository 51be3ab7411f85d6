"""``kvwatch histories``'s flags (``parser.py`` holds the rest of the command line)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def add_histories(sub: argparse._SubParsersAction, positive: Callable[[str], int]) -> None:
    """``kvwatch histories``; ``positive``: the parser's check of a count."""
    histories = sub.add_parser(
        "histories",
        help="play generated client histories on an engine in process, judge, shrink failures",
    )
    histories.add_argument(
        "--engine",
        choices=["kvwatch", "kvwatch-http", "sglang", "vllm", "lightllm"],
        default="kvwatch",
    )
    _add_releases(histories)
    histories.add_argument(
        "--seeds", default="0-2", help="one history per seed: 0-9, 3 or 1,4,7 (default: 0-2)"
    )
    histories.add_argument("--turns", type=positive, default=4, help="turns per history")
    histories.add_argument("--ops", type=positive, default=12, help="operations per turn")
    histories.add_argument(
        "--engine-set", action="append", default=[], metavar="KEY=VALUE",
        help="an engine setting on top of the history tier's (e.g. cache.mode=slots)",
    )  # fmt: skip
    histories.add_argument(
        "--inject", action="append", default=[], metavar="FAULT", help="switch a fault on"
    )
    histories.add_argument(
        "--turns-apart",
        action="store_true",
        help="never place two turns of one session at one step (keeps that crash out of the way)",
    )
    histories.add_argument("--out", type=Path, default=Path("kvwatch-histories"))
    histories.add_argument(
        "--shrink-budget", type=positive, default=200, help="plays spent shrinking one failure"
    )
    histories.add_argument(
        "--replay", type=Path, default=None, metavar="FILE", help="play a saved history again"
    )
    histories.add_argument(
        "--export",
        type=Path,
        default=None,
        metavar="OUT.py",
        help="with --replay FILE (a vLLM history): write a script that replays it with vLLM "
        "alone, instead of playing it",
    )
    histories.set_defaults(handler="histories")


def _add_releases(histories: argparse.ArgumentParser) -> None:
    """The release and setup of an upstream engine the histories play on."""
    histories.add_argument(
        "--sglang-version", default=None, metavar="V", help="with --engine sglang (default: 0.5.23)"
    )
    histories.add_argument(
        "--sglang-setup",
        default=None,
        metavar="NAME",
        help="with --engine sglang: sessions-retract (default), plain, mamba, "
        "sessions-pressure, overlap, sessions-overlap, mamba-sessions, mamba-priority",
    )
    histories.add_argument(
        "--vllm-version",
        default=None,
        metavar="V",
        help="with --engine vllm (default: 0.33.0): from $KVWATCH_VLLM_PYTHON or .venv-vllm, "
        "or .vllm-releases/V unpacked over it",
    )
    histories.add_argument(
        "--vllm-setup",
        default=None,
        metavar="NAME",
        help="with --engine vllm: plain (default), async, priority, events, hybrid-swa, "
        "mamba-align, streaming, streaming-async, streaming-mamba, long-prefill, watermark, "
        "prefill-interval, active-seqs, no-full-isl",
    )
    histories.add_argument(
        "--lightllm-setup",
        default=None,
        metavar="NAME",
        help="with --engine lightllm: radix (default), linear",
    )
    histories.add_argument(
        "--lightllm-src",
        default=None,
        metavar="DIR",
        help="with --engine lightllm: a LightLLM source checkout (default: $KVWATCH_LIGHTLLM_SRC)",
    )
