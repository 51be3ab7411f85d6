"""The real-bug corpus's rows (``docs/real-bugs.json``): read, written and judged.

``BugRow`` is one row, every key of the schema (``real_bugs.py``'s docstring)
always present, so a row read and written back is the same row; ``Side`` is
one gate run of it. A row holds when its buggy run exits 1 with ``expect``
failing and its fixed run exits 0 (``problems``); it counts (``counted``) only
when it holds and the engine's own code decided both runs, never a kvwatch
stand-in.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "docs" / "real-bugs.json"
DECIDERS = ("engine", "modelled")  # decided_by: the engine's own code, or a kvwatch stand-in
CHECKOUT_FLAG = "--lightllm-src"  # a row whose version is a commit of a source checkout
VLLM_PYTHON = ".venv-vllm/bin/python"  # what make vllm-release unpacks releases beside


class Side(NamedTuple):
    """One gate run of a row: on the buggy or on the fixed release."""

    exit: int
    detector: str | None  # the failing detector (the expected one first), or None
    evidence: str  # its evidence line; the run's error on exit 3; "" on a pass

    def to_json(self) -> dict:
        return self._asdict()


@dataclass(frozen=True, kw_only=True)
class BugRow:
    id: str
    engine: str
    fix: str | None
    issue: str | None
    buggy: str
    fixed: str | None
    summary: str
    trigger: str
    gate: tuple[str, ...] | None
    version_flag: str | None
    expect: str | None
    ci: bool
    decided_by: str
    result: dict[str, Side] | None
    note: str

    @classmethod
    def from_json(cls, data: dict) -> BugRow:
        names = [f for f in cls.__dataclass_fields__]
        if sorted(data) != sorted(names):
            raise ValueError(f"row {data.get('id')!r}: keys {sorted(data)}, want {sorted(names)}")
        result = data["result"]
        return cls(
            **{
                **data,
                "gate": tuple(data["gate"]) if data["gate"] is not None else None,
                "result": {k: Side(**v) for k, v in result.items()} if result else None,
            }
        )

    def to_json(self) -> dict:
        out = asdict(self)
        out["gate"] = list(self.gate) if self.gate is not None else None
        out["result"] = {k: v.to_json() for k, v in self.result.items()} if self.result else None
        return out

    def argv(self, version: str, out: Path) -> list[str]:
        """``kvwatch gate`` on ``version``, writing under ``out``."""
        return ["gate", *self.gate, self.version_flag, version, "--out", str(out), "--no-report"]

    def command(self, version: str) -> str:
        """The command line a reader runs (``--out`` and ``--no-report`` left out); a
        commit of a source checkout reads ``DIR`` (a checkout of that commit)."""
        if self.version_flag == CHECKOUT_FLAG:
            version = f"DIR  # DIR: a LightLLM checkout of {version[:12]}"
        gate = ["kvwatch", "gate", *self.gate]
        if self.version_flag == "--vllm-version":  # vLLM's own venv, the release over it
            gate = [f"make vllm-release V={version} &&", *gate, "--vllm-python", VLLM_PYTHON]
        return " ".join([*gate, self.version_flag, version])


def load(path: Path = CORPUS) -> list[BugRow]:
    rows = [BugRow.from_json(r) for r in json.loads(path.read_text())]
    ids = [r.id for r in rows]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: an id appears twice")
    return rows


def save(rows: Sequence[BugRow], path: Path = CORPUS) -> None:
    path.write_text(json.dumps([r.to_json() for r in rows], indent=2) + "\n")


def problems(rows: Sequence[BugRow]) -> list[str]:
    """What the rows fail to show: a buggy run that did not fail with its expected
    detector, a fixed run that did not pass, a gated row never run."""
    out = []
    for row in rows:
        if row.decided_by not in DECIDERS:
            out.append(f"{row.id}: decided_by is one of {', '.join(DECIDERS)}")
        if row.gate is None:
            continue
        if not row.result:
            out.append(f"{row.id}: not run")
            continue
        bug = row.result.get("buggy")
        if bug is None or (bug.exit, bug.detector) != (1, row.expect):
            out.append(f"{row.id}: {row.buggy} should exit 1 with {row.expect} failing: {bug}")
        fix = row.result.get("fixed")
        if row.fixed is not None and (fix is None or fix.exit != 0):
            out.append(f"{row.id}: {row.fixed} should exit 0: {fix}")
    return out


def counted(rows: Sequence[BugRow]) -> list[BugRow]:
    """The gated rows that hold and that the engine's own code decided: the score."""
    wrong = {p.split(":")[0] for p in problems(rows)}
    gated = [r for r in rows if r.gate is not None and r.result and r.id not in wrong]
    return [r for r in gated if r.decided_by == "engine"]
