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
from pathlib import Path

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


def _serve(args: argparse.Namespace) -> int:
    from kvwatch.serve import ServeOptions, engine_config, serve
    from kvwatch.server import ServerSettings

    try:
        settings = ServerSettings(
            enable_probe=args.enable_probe,
            probe_token=args.probe_token,
            capture_content=args.capture_content,
            max_body_bytes=args.max_body_bytes,
        )
        options = ServeOptions(
            host=args.host,
            port=args.port,
            prefix_cache=args.prefix_cache,
            device=args.device,
            faults=tuple(args.inject),
            settings=settings,
            run_dir=args.run_dir,
            log_level=args.log_level,
        )
        engine_config(options)  # fail fast on a bad flag or KVWATCH_FAULTS
    except ValueError as exc:
        print(f"kvwatch serve: {exc}", file=sys.stderr)
        return 2
    if args.probe_token and not args.enable_probe:
        print("kvwatch serve: --probe-token needs --enable-probe", file=sys.stderr)
        return 2
    return serve(options)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvwatch", description="Leak detection and observability for LLM prefix caches."
    )
    parser.add_argument("--version", action="version", version=f"kvwatch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    faults = sub.add_parser("faults", help="list the fault registry")
    faults.add_argument("--json", action="store_true", help="print the registry as JSON")
    faults.set_defaults(run=_faults)

    serve = sub.add_parser("serve", help="run the reference engine behind an OpenAI-compatible API")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--prefix-cache", choices=["radix", "slots", "off"], default="radix")
    serve.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    serve.add_argument(
        "--inject", action="append", default=[], metavar="FAULT", help="switch a fault on"
    )
    serve.add_argument("--enable-probe", action="store_true", help="mount /debug/* endpoints")
    serve.add_argument("--probe-token", default=None, help="require this bearer token on /debug/*")
    serve.add_argument("--capture-content", action="store_true", help="record prompt text on spans")
    serve.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024)
    serve.add_argument("--run-dir", type=Path, default=None, help="write spans.jsonl here")
    serve.add_argument("--log-level", default="warning")
    serve.set_defaults(run=_serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except BrokenPipeError:  # `kvwatch faults | head`: the reader left, which is fine
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keep Python's exit flush quiet
        return 0
