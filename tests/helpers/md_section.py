"""What the generated sections of BENCHMARKS.md share: where and how they were
measured, and putting a fresh section in place of the old one.

A section starts at its ``## `` heading and ends before the next ``## ``
heading (or the end of the file), so replacing it leaves every other line as
it was.
"""

from __future__ import annotations


def measured(data: dict, command: str, *, quiet: bool) -> str:
    """``Measured WHEN UTC on CPU (N cores), Python V, with `COMMAND` (or `make bench`), ...``
    from pytest-benchmark's JSON, saying whether anything else ran."""
    machine = data.get("machine_info", {})
    cpu = machine.get("cpu", {})
    when = data.get("datetime", "")[:19]
    return (
        f"Measured {when} UTC on {cpu.get('brand_raw', 'cpu')} ({cpu.get('count', '?')} cores), "
        f"Python {machine.get('python_version', '?')}, with `{command}` (or `make bench`), "
        + ("nothing else running" if quiet else "on a machine shared with other work")
    )


def replace_section(text: str, heading: str, new: list[str]) -> str:
    """``text`` with the section under ``heading`` replaced by ``new`` (appended if
    it has none)."""
    lines = text.rstrip("\n").split("\n")
    start = next((k for k, line in enumerate(lines) if line == heading), None)
    if start is None:
        return "\n".join([*lines, "", *new]) + "\n"
    end = next((k for k in range(start + 1, len(lines)) if lines[k].startswith("## ")), len(lines))
    tail = ["", *lines[end:]] if end < len(lines) else []
    return "\n".join([*lines[:start], *new, *tail]) + "\n"
