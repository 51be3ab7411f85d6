"""The promise table in docs/contracts.md stays whole and true to the code.

Every metric the engine exports has a row (a new gauge or counter cannot land
without saying what holds it to the truth, or "none" in plain sight); every
oracle a row names is a detector id or "none"; every profile it names exists.
"""

from __future__ import annotations

import re

from paths import REPO

from kvwatch.gate.verdicts.detectors import IDS
from kvwatch.harness.profiles import PROFILES
from kvwatch.instrumentation import names as n

CONTRACTS = REPO / "docs" / "contracts.md"


def rows() -> list[tuple[str, str, str]]:
    text = CONTRACTS.read_text()
    section = text[text.index("## Promises") : text.index("## Faults")]
    out = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1] and not set(cells[1]) <= {"-"} and cells[0] != "promise":
            out.append((cells[0], cells[1], cells[2]))
    return out


def test_every_metric_the_engine_exports_has_a_row():
    promises = " ".join(r[0] for r in rows())
    exported = [*n.ENGINE_GAUGES, *n.COUNTERS, *n.SECONDS]
    missing = [n.prom(m) for m in exported if n.prom(m) not in promises]
    assert not missing, f"no promise row for {missing}"


def test_every_oracle_is_a_detector_or_none_and_every_profile_exists():
    assert len(rows()) > 30
    for promise, oracle, exercised in rows():
        named = set(re.findall(r"`([a-z][a-z-]*)`", oracle.split("(")[0]))
        assert oracle.startswith("none") or named, f"{promise}: oracle {oracle!r}"
        assert named <= set(IDS) | {"none"}, f"{promise}: {named - set(IDS)}"
        profiles = set(re.findall(r"`([a-z][a-z-]*)`", exercised))
        assert exercised in ("every profile", "none") or profiles, f"{promise}: {exercised!r}"
        assert profiles <= set(PROFILES), f"{promise}: {profiles - set(PROFILES)}"


def test_the_none_rows_are_few_and_named():
    """What no gate holds the engine to, in plain sight (a bug there passes)."""
    unheld = [promise for promise, oracle, _ in rows() if oracle.startswith("none")]
    assert len(unheld) <= 5, unheld  # none at present: every row names its oracle
