"""Render the dashboards to JSON, write them, and find drift from what is committed.

The JSON is what Grafana's dashboard model expects (``schemaVersion``,
``panels`` with ``gridPos``, ``templating``, ``annotations``); keys are sorted
and indented so a change to a builder reads as a small diff.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from grafana_foundation_sdk.cog.encoder import JSONEncoder

from kvwatch.dashboards import DASHBOARDS

COMMITTED = Path(__file__).parent / "json"


def render(uid: str) -> str:
    """One dashboard as the text that is committed (ends with a newline)."""
    return JSONEncoder(sort_keys=True, indent=2).encode(DASHBOARDS[uid]().build()) + "\n"


def models() -> dict[str, dict]:
    """Every dashboard as a JSON object, by uid."""
    return {uid: json.loads(render(uid)) for uid in DASHBOARDS}


def write(out: Path = COMMITTED) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for uid in DASHBOARDS:
        path = out / f"{uid}.json"
        path.write_text(render(uid))
        written.append(path)
    return written


def drift(out: Path = COMMITTED) -> list[str]:
    """Files in ``out`` that differ from what the builders make now (missing ones too)."""
    stale = [f"{uid}.json" for uid in DASHBOARDS if not _same(out / f"{uid}.json", render(uid))]
    extra = sorted(p.name for p in out.glob("*.json") if p.stem not in DASHBOARDS)
    return stale + extra


def _same(path: Path, text: str) -> bool:
    return path.exists() and path.read_text() == text


def targets(model: dict) -> Iterator[tuple[str, dict]]:
    """(panel title, target) for every query of every panel, rows included."""
    for panel in model.get("panels", ()):
        for inner in [panel, *panel.get("panels", ())]:
            for target in inner.get("targets", ()):
                yield inner.get("title", ""), target
