"""The one report writer of every hunt: ``OUT.json`` and ``OUT.md``, the hand-written part kept.

``document(title, intro, settings, sections)`` is a hunt's markdown above the
marker: its title, what wrote it, one settings paragraph, then each section
(a heading and its lines: the tables of ``gate_tables.py`` or
``driver_tables.py``). ``write(out, settings, rows, markdown)`` writes
``out``.json (the settings and every row) and ``out``.md: the markdown, the
marker, then everything that stood below ``HAND_WRITTEN`` in the ``out``.md
already there (the candidates' upstream search, verdicts, answers to
questions about the table), as it was.

Invariant: a rerun rewrites what is above the marker and never what is
below it; ``out`` is the caller's path (the Makefile names ``docs/...``),
never one taken from the working directory.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

HAND_WRITTEN = "<!-- written by hand below this line; the hunt keeps it -->"


def cell(text: object) -> str:
    """``text`` as one markdown table cell."""
    return str(text).replace("|", "/").replace("\n", " ")


def document(
    title: str,
    intro: Sequence[str],
    settings: str,
    sections: Sequence[tuple[str, Sequence[str]]],
) -> str:
    """The markdown above the marker: title, intro, settings, then each (heading, lines)."""
    lines = [f"# {title}", "", *intro, "", settings]
    for heading, body in sections:
        lines += ["", f"## {heading}", "", *body]
    return "\n".join(lines) + "\n"


def write(out: Path, settings: dict, rows: list[dict], markdown: str) -> None:
    """``out``.json (settings and rows) and ``out``.md (``markdown``, then the kept part)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out.with_suffix(".json"), out.with_suffix(".md")
    json_path.write_text(json.dumps({"settings": settings, "runs": rows}, indent=1) + "\n")
    kept = ""
    if md_path.exists() and HAND_WRITTEN in (old := md_path.read_text()):
        kept = old[old.index(HAND_WRITTEN) + len(HAND_WRITTEN) :]
    md_path.write_text(markdown + "\n" + HAND_WRITTEN + (kept or "\n"))
