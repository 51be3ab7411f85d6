"""The ``kvwatch`` command line's flags: one parser, its subcommands and the
checks argparse makes on their values.

Each subcommand names its handler (``handler``, a key of ``cli.HANDLERS``);
a bad value is a usage error, one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path
from typing import NoReturn

from kvwatch import MODEL_NAME, __version__
from kvwatch.parser_histories import add_histories

GRAFANA_TOKEN_ENV = "GRAFANA_TOKEN"  # read when --token / --grafana-token is not given
VLLM_PYTHON_ENV = "KVWATCH_VLLM_PYTHON"  # read when --vllm-python is not given


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line on stderr (and exit 2, as argparse's).

    argparse prints the whole usage block before the error; in a CI log that
    buries the one line that says what was wrong. ``--help`` still shows the usage.
    Subparsers are made of the same class (``add_subparsers`` takes the parent's).
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):
        """An unknown flag is the subcommand's error (``kvwatch gate: error: ...``),
        with the flag it most likely meant, not the top-level parser's."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self._subcommand(parsed)
            if command is None:
                self.error(f"unrecognized arguments: {' '.join(extras)}")
            command.error(
                f"unrecognized arguments: {' '.join(extras)}{_did_you_mean(command, extras)}"
            )
        return parsed

    def _subcommand(self, parsed: argparse.Namespace) -> argparse.ArgumentParser | None:
        """The innermost subcommand parser ``parsed`` went through (``dashboards build``)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(parsed, action.dest, None) or "")
                if chosen is None:
                    return None
                inner = chosen._subcommand(parsed) if isinstance(chosen, OneLineParser) else None
                return inner or chosen
        return None


def _did_you_mean(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    flags = [f for a in parser._actions for f in a.option_strings if f.startswith("--")]
    for extra in extras:
        if extra.startswith("--"):
            close = difflib.get_close_matches(extra.split("=")[0], flags, n=1)
            if close:
                return f"; did you mean {close[0]}?"
    return ""


def _concurrency(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"want a list like 1,2,4,8, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("want at least one concurrency")
    if twice := sorted({v for v in values if values.count(v) > 1}):
        raise argparse.ArgumentTypeError(
            f"lists {', '.join(map(str, twice))} more than once: each concurrency runs once"
        )
    return values


class _MoreConcurrencies(argparse.Action):
    """``-c`` given again adds to the list: ``-c 1 -c 8`` is ``-c 1,8``, never the
    last one alone; a concurrency named twice is an error, as within one list."""

    def __call__(self, parser, namespace, values, option_string=None):
        have = tuple(getattr(namespace, self.dest) or ())
        if twice := sorted(set(have) & set(values)):
            listed = ", ".join(map(str, twice))
            raise argparse.ArgumentError(
                self, f"lists {listed} more than once: each concurrency runs once"
            )
        setattr(namespace, self.dest, have + values)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(
            f"want a TCP port in 0..65535 (0: any free one), got {text!r}"
        )
    return port


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"want a whole number >= 1, got {text!r}")
    return value


def _duration(text: str) -> float:
    from kvwatch.gate.soak import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="kvwatch", description="Leak detection and observability for LLM prefix caches."
    )
    parser.add_argument("--version", action="version", version=f"kvwatch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    faults = sub.add_parser("faults", help="list the fault registry")
    faults.add_argument("--json", action="store_true", help="print the registry as JSON")
    faults.set_defaults(handler="faults")
    _add_serve(sub)
    profiles = sub.add_parser("profiles", help="list the load profiles")
    profiles.add_argument("--json", action="store_true", help="print the profiles as JSON")
    profiles.set_defaults(handler="profiles")
    _add_gate(sub)
    add_histories(sub, _positive)
    _add_dashboards(sub)
    return parser


def _add_serve(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser("serve", help="run the reference engine behind an OpenAI-compatible API")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument(
        "--port", type=_port, default=8000, help="default: 8000; 0 takes a free port (printed)"
    )
    serve.add_argument(
        "--prefix-cache", choices=["radix", "slots", "off"], default=None, help="default: radix"
    )
    serve.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help='JSON engine-config overrides, e.g. {"cache": {"full_kv": {"capacity": 1024}}}',
    )
    serve.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    serve.add_argument(
        "--inject", action="append", default=[], metavar="FAULT", help="switch a fault on"
    )
    serve.add_argument("--enable-probe", action="store_true", help="mount /debug/* endpoints")
    serve.add_argument(
        "--step-by-step",
        action="store_true",
        help="with --enable-probe: the engine steps only on POST /debug/step",
    )
    serve.add_argument("--probe-token", default=None, help="require this bearer token on /debug/*")
    serve.add_argument("--capture-content", action="store_true", help="record prompt text on spans")
    serve.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024)
    serve.add_argument(
        "--max-header-bytes",
        type=int,
        default=16 * 1024,
        help="all request headers together; more gets a 431 (default: 16384)",
    )
    serve.add_argument(
        "--session-idle-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="close sessions no request has used for this long (default: never)",
    )
    serve.add_argument("--run-dir", type=Path, default=None, help="write spans.jsonl here")
    serve.add_argument("--log-level", default="warning")
    serve.set_defaults(handler="serve")


def _add_gate(sub: argparse._SubParsersAction) -> None:
    """The gate's flags, in the order ``--help`` lists them: each helper adds one
    group, and the groups are called in that order so the help text stays as it is."""
    gate = sub.add_parser(
        "gate",
        help="run the load profiles in turns and judge them with the leak detectors",
        description="Exit codes: 0 every detector passed, 1 a detector failed, "
        "2 usage or config error, 3 the run itself broke.",
    )
    _add_gate_load(gate)
    _add_gate_outputs(gate)
    _add_gate_target(gate)
    _add_gate_locust(gate)
    _add_gate_engine(gate)
    _add_gate_sglang(gate)
    _add_gate_lightllm(gate)
    _add_gate_publishing(gate)
    gate.set_defaults(handler="gate")


def _add_gate_load(gate: argparse.ArgumentParser) -> None:
    """What load runs: the profiles, their concurrencies, turns or a soak, and faults."""
    gate.add_argument("--profile", action="append", default=[], metavar="NAME", help="default: all")
    gate.add_argument(
        "-c",
        type=_concurrency,
        action=_MoreConcurrencies,
        default=None,
        metavar="1,2,4,8",
        help="default: 1,2,4,8; soak: 4 (again adds: -c 1 -c 8 is -c 1,8)",
    )
    gate.add_argument(
        "--turns", type=int, default=None, help="default: the profile's own (6; rl-rollout 8)"
    )
    gate.add_argument(
        "--quick",
        action="store_true",
        help="the pull-request tier: -c 2 --max-replays 16 (each unless given)",
    )
    gate.add_argument(
        "--soak",
        type=_duration,
        default=None,
        metavar="DURATION",
        help="instead of turns: agentic load for DURATION (600, 90s, 10m), probed while it runs",
    )
    gate.add_argument("--inject", action="append", default=[], metavar="FAULT")


def _add_gate_outputs(gate: argparse.ArgumentParser) -> None:
    """Where the verdict goes: the output folder and the JUnit file."""
    gate.add_argument("--out", type=Path, default=Path("kvwatch-out"))
    gate.add_argument("--junit", type=Path, default=None, metavar="FILE")
    gate.add_argument(
        "--strict",
        action="store_true",
        help="a notice (a broken invariant its engine holds harmless) fails the gate",
    )


def _add_gate_target(gate: argparse.ArgumentParser) -> None:
    """A black-box run against an external engine: its address, its metrics and the
    usage gauges to trend."""
    gate.add_argument("--target", default=None, metavar="URL", help="an external engine")
    gate.add_argument("--metrics-url", default=None, metavar="URL", help="its /metrics page")
    gate.add_argument(
        "--gauges", default=None, help="gauge preset: kvwatch (default), vllm or sglang"
    )
    gate.add_argument(
        "--gauge",
        action="append",
        default=[],
        metavar="SERIES",
        help='another usage series to trend, e.g. my_pool_used{pool="state"}',
    )


def _add_gate_locust(gate: argparse.ArgumentParser) -> None:
    """How Locust drives the load: its worker processes, the seed its users draw from,
    and how many profiles run side by side."""
    gate.add_argument("--locust-workers", type=int, default=None, metavar="N", help="default: 0")
    gate.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="profiles run side by side, each on its own engine (default: one per core; "
        "1 where one server serves every profile)",
    )
    gate.add_argument("--seed", type=int, default=0)


def _add_gate_engine(gate: argparse.ArgumentParser) -> None:
    """The engine the gate starts and the model it asks for, and how much of a run
    the cache-off engine replays."""
    gate.add_argument(
        "--model",
        default=MODEL_NAME,
        help="the model name to ask for (--engine vllm: the model's directory)",
    )
    gate.add_argument(
        "--engine",
        choices=("kvwatch", "vllm", "vllm-scheduler", "sglang-cache", "lightllm-cache"),
        default=None,
        help="the engine to start and probe (default: kvwatch); vllm: from --model DIR; "
        "vllm-scheduler: vLLM's own scheduler in process, with no model; "
        "sglang-cache: SGLang's caches in process, from --sglang-version; "
        "lightllm-cache: LightLLM's caches and infer loop, from --lightllm-src",
    )
    gate.add_argument(
        "--vllm-python",
        default=None,
        metavar="PATH",
        help=f"a Python with vLLM and kvwatch (default: ${VLLM_PYTHON_ENV} or this one)",
    )
    gate.add_argument(
        "--vllm-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="an argument for vLLM's server, e.g. --vllm-arg=--num-gpu-blocks-override=512",
    )
    gate.add_argument(
        "--vllm-version",
        default=None,
        metavar="V",
        help="the vLLM release to run: --vllm-python's, .venv-vllm-V or .vllm-releases/V "
        "(make vllm-venv V=..., make vllm-release V=...)",
    )
    gate.add_argument(
        "--engine-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a field of kvwatch's engine config in every profile, a JSON value, e.g. "
        "cache.full_kv.page_size=8, scheduler.prefix_waits=false, scheduler.spec=null "
        "(cache.failpoints=null: no failpoints)",
    )
    gate.add_argument(
        "--max-replays",
        type=int,
        default=None,
        metavar="N",
        help="replay at most N comparable requests per run, spread over the run (default: all)",
    )


def _add_gate_sglang(gate: argparse.ArgumentParser) -> None:
    """``--engine sglang-cache``: which SGLang release, which of its caches, which page size."""
    gate.add_argument(
        "--sglang-version",
        default=None,
        metavar="V",
        help="the SGLang release whose caches run (its wheel is downloaded once), e.g. 0.5.23",
    )
    gate.add_argument(
        "--sglang-cache",
        choices=("radix", "mamba", "swa"),
        default=None,
        help="the cache SGLang builds for a full-attention (radix, default), hybrid SSM "
        "(mamba) or hybrid sliding-window (swa) model",
    )
    gate.add_argument(
        "--page-size", type=int, default=None, metavar="N", help="SGLang's page size (default: 1)"
    )


def _add_gate_lightllm(gate: argparse.ArgumentParser) -> None:
    """``--engine lightllm-cache``: which LightLLM checkout, which of its caches."""
    gate.add_argument(
        "--lightllm-src",
        default=None,
        metavar="DIR",
        help="a LightLLM source checkout whose caches and infer loop run (on CPU, unmodified)",
    )
    gate.add_argument(
        "--lightllm-cache",
        choices=("radix", "linear"),
        default=None,
        help="LightLLM's RadixCache (radix, default) or the LinearAttPagedRadixCache of "
        "hybrid linear-attention models (linear)",
    )


def _add_gate_publishing(gate: argparse.ArgumentParser) -> None:
    """What the gate publishes beyond summary.json: the HTML report, the
    Pushgateway's metrics and Grafana's annotations."""
    gate.add_argument("--no-report", action="store_true", help="skip report.html")
    gate.add_argument(
        "--pushgateway", default=None, metavar="URL", help="push the verdict metrics here"
    )
    gate.add_argument(
        "--grafana-url", default=None, metavar="URL", help="annotate findings in this Grafana"
    )
    gate.add_argument(
        "--grafana-token", default=None, metavar="T", help=f"default: ${GRAFANA_TOKEN_ENV}"
    )


def _add_dashboards(sub: argparse._SubParsersAction) -> None:
    dashboards = sub.add_parser("dashboards", help="the Grafana dashboards: build or push")
    dash = dashboards.add_subparsers(dest="action", required=True)
    build = dash.add_parser("build", help="regenerate the dashboard JSON")
    build.add_argument("--out", type=Path, default=None, help="default: the committed folder")
    build.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if the JSON has drifted"
    )
    build.set_defaults(handler="dashboards_build")
    push = dash.add_parser("push", help="upsert the dashboards (and a datasource) into Grafana")
    push.add_argument("--grafana-url", required=True, metavar="URL")
    push.add_argument("--token", default=None, metavar="T", help=f"default: ${GRAFANA_TOKEN_ENV}")
    push.add_argument(
        "--prometheus-url", default=None, metavar="URL", help="create or update this datasource"
    )
    push.add_argument("--folder", default="kvwatch", metavar="UID", help="the folder's uid")
    push.set_defaults(handler="dashboards_push")
