"""The command lists in README.md and docs/contracts.md name exactly the flags the
CLI takes: a flag added, renamed or removed in ``kvwatch.cli`` fails here until
both documents say so. Every other ``kvwatch`` command line in the README's code
blocks may use only flags that exist."""

from __future__ import annotations

import argparse
import re

import pytest
from paths import REPO as ROOT

from kvwatch.cli import build_parser

README = ROOT / "README.md"
CONTRACTS = ROOT / "docs" / "contracts.md"
FLAG = re.compile(r"(?<![\w=-])(--[a-z][a-z0-9-]*|-[a-z])(?![\w-])")
Commands = dict[tuple[str, ...], set[str]]


def real_flags(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Commands:
    """Every subcommand's path (``("dashboards", "build")``) and the flags it takes."""
    found: Commands = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= real_flags(sub, (*path, name))
    if path and not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions):
        found[path] = {o for a in parser._actions for o in a.option_strings} - {"-h", "--help"}
    return found


def code_blocks(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M)


def documented(block: str, commands: Commands) -> Commands:
    """The flags each ``kvwatch ...`` line of ``block`` names, with its indented
    continuation lines; comments (from ``#``) and what kvwatch prints
    (``kvwatch serve: ...``) left out."""
    found: Commands = {}
    current: tuple[str, ...] | None = None
    for raw in block.splitlines():
        line = raw.split("#", 1)[0]
        words = line.split()
        if words[:1] == ["kvwatch"] and not words[1:2][0].endswith(":"):
            current = longest_command(words[1:], commands)
            found.setdefault(current, set())
        elif not raw.startswith(" ") or current is None:
            current = None
            continue
        found[current] |= set(FLAG.findall(line))
    return found


def longest_command(words: list[str], commands: Commands) -> tuple[str, ...]:
    """The longest run of leading words that is a real subcommand, or the words up
    to the first flag (then the test reports it as unknown)."""
    path = tuple(w for w in words[: next((i for i, w in enumerate(words) if w[0] in "-["), None)])
    for end in range(len(path), 0, -1):
        if path[:end] in commands:
            return path[:end]
    return path


def the_list(text: str, heading: str) -> str:
    """The code block that follows ``heading``."""
    return code_blocks(text[text.index(heading) :])[0]


COMMANDS = real_flags(build_parser())


@pytest.mark.parametrize(
    "document, heading",
    [(README, "The `kvwatch` command inside `.venv`:"), (CONTRACTS, "## CLI")],
    ids=["README", "contracts"],
)
def test_the_command_list_names_every_subcommand_and_flag_there_is(document, heading):
    listed = documented(the_list(document.read_text(), heading), COMMANDS)
    assert set(listed) == set(COMMANDS)
    for command, flags in COMMANDS.items():
        name = " ".join(command)
        assert listed[command] - flags == set(), f"{document.name}: kvwatch {name}: no such flag"
        assert flags - listed[command] == set(), f"{document.name}: kvwatch {name}: not listed"


def test_every_kvwatch_line_in_the_readme_uses_real_flags():
    seen = set()
    for block in code_blocks(README.read_text()):
        for command, flags in documented(block, COMMANDS).items():
            assert command in COMMANDS, f"README: kvwatch {' '.join(command)}: no such command"
            assert flags <= COMMANDS[command], (command, flags - COMMANDS[command])
            seen.add(command)
    assert seen == set(COMMANDS)  # the lines were found and read as commands


def test_the_parser_walk_sees_nested_subcommands():
    """The walk the checks above rely on: ``dashboards`` has two leaves, and a
    flag's short and long spellings are both there."""
    assert {("dashboards", "build"), ("dashboards", "push")} <= set(COMMANDS)
    assert ("dashboards",) not in COMMANDS
    assert {"-c", "--soak", "--target"} <= COMMANDS[("gate",)]
    assert "--help" not in COMMANDS[("faults",)]


def test_the_readme_counts_and_lists_the_detectors_the_gate_runs():
    from kvwatch.gate.verdicts.detectors import IDS

    text = (ROOT / "README.md").read_text()
    line = next(x for x in text.splitlines() if "leak detectors:" in x)
    count, _, names = line.partition(" leak detectors: ")
    assert int(count.strip("| ")) == len(IDS)
    assert re.findall(r"`([a-z-]+)`", names.split(";")[0]) == list(IDS)
    assert f"passes all {len(IDS)} detectors" in text
