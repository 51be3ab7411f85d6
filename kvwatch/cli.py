"""The ``kvwatch`` command line.

Subcommands parse their own flags and call into the library; they hold no
logic of their own. Exit code 2 means a usage or config error (argparse's
convention, and the contract of ``kvwatch gate``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from kvwatch import __version__


def _faults(args: argparse.Namespace) -> int:
    from kvwatch.engine.faults import REGISTRY

    entries = [info.as_dict() for info in REGISTRY.values()]
    if args.json:
        json.dump(entries, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    width = max(len(e["name"]) for e in entries)
    print(f"{'fault':<{width}}  seed  summary")
    for e in entries:
        print(f"{e['name']:<{width}}  {e['seed']:<4}  {e['summary']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvwatch", description="Leak detection and observability for LLM prefix caches."
    )
    parser.add_argument("--version", action="version", version=f"kvwatch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    faults = sub.add_parser("faults", help="list the fault registry")
    faults.add_argument("--json", action="store_true", help="print the registry as JSON")
    faults.set_defaults(run=_faults)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except BrokenPipeError:  # `kvwatch faults | head`: the reader left, which is fine
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keep Python's exit flush quiet
        return 0
