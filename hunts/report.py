"""A hunt's two files, ``OUT.json`` and ``OUT.md``, written so a rerun keeps the hand-written part.

Shared by every hunt (``vllm/hunt_report.py``, ``gate_tables.py``).
Everything below ``HAND_WRITTEN`` in an existing ``OUT.md`` (the candidates'
upstream search, verdicts, answers to questions about the table) is kept
as it is: the table above the marker is rewritten, the reading of it is not.
"""

from __future__ import annotations

import json
from pathlib import Path

HAND_WRITTEN = "<!-- written by hand below this line; the hunt keeps it -->"


def write(out: Path, settings: dict, rows: list[dict], markdown: str) -> None:
    """``out``.json (settings and rows) and ``out``.md (``markdown``, then the kept part)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out.with_suffix(".json"), out.with_suffix(".md")
    json_path.write_text(json.dumps({"settings": settings, "runs": rows}, indent=1) + "\n")
    kept = ""
    if md_path.exists() and HAND_WRITTEN in (old := md_path.read_text()):
        kept = old[old.index(HAND_WRITTEN) + len(HAND_WRITTEN) :]
    md_path.write_text(markdown + "\n" + HAND_WRITTEN + (kept or "\n"))
