"""The real-bug corpus: bugs real engines shipped, each gated on the release with
the bug and on the release with the fix.

    python -m mutation.real_bugs          # what `make real-bugs` runs
    python -m mutation.real_bugs --engine sglang --only ID  # rerun some rows
    python -m mutation.real_bugs --render # re-render the markdown only

``docs/real-bugs.json`` is a list of rows, one per bug, every key always present::

    {"id": "sglang-pr-22862",            unique; the markdown's anchor
     "engine": "sglang",                 whose bug (sglang, vllm, ...)
     "fix": "PR #22862",                 the change that fixed it (null: none yet)
     "issue": null,                      the report, "issue #N" (null: none)
     "buggy": "0.5.10.post1",            a release with the bug
     "fixed": "0.5.11",                  the first release with the fix (null: none yet)
     "summary": "...",                   what goes wrong, in the engine's own terms
     "trigger": "...",                   what a workload must do to hit it
     "gate": ["--engine", "sglang-cache", "--profile", "sessions", "-c", "4"],
                                         kvwatch gate's flags for both runs (null: no
                                         gate drives it; "note" says why)
     "version_flag": "--sglang-version", the flag the release goes to: the runner adds
                                         [version_flag, buggy] and [version_flag, fixed]
     "expect": "allocator",              the detector that must fail on "buggy"
     "ci": true,                         the test suite runs this row's two gates
                                         (tests/mutation/test_real_bugs_live.py, make test)
     "decided_by": "engine",             what decides the verdicts: "engine", the engine's
                                         own code (SGLang's scheduler and caches as shipped,
                                         vLLM's own scheduler), or "modelled", a kvwatch
                                         stand-in for part of it (a scheduler shim): such a
                                         row is kept, but does not count
     "result": {"buggy": {"exit": 1, "detector": "allocator", "evidence": "..."},
                "fixed": {"exit": 0, "detector": null, "evidence": ""}},
                                         what the last `make real-bugs` measured (null:
                                         not run); detector: the failing one, the
                                         expected one first (null: none failed);
                                         evidence: its evidence line, or the run's
                                         error on exit 3
     "note": "..."}                      anything else; for a row no gate drives,
                                         exactly why

A row holds when its buggy run exits 1 with ``expect`` failing and its fixed
run exits 0 (``problems``); it counts (``counted``) when it holds and the
engine's own code decided both runs; each such row has a swap test
(``tests/targets/{sglang,vllm,lightllm}/test_*_engine_decides.py``: what
kvwatch plays of the engine replaced, the verdicts unmoved). Each run is
``kvwatch gate GATE VERSION_FLAG V --out DIR --no-report`` in a process of
its own. ``docs/real-bugs.md`` is
rendered from the JSON alone (``render``), so the test that checks the
document reads the same rows; only what follows the ``HAND_WRITTEN`` line
(a write-up of a bug hunt, say) is prose kept as it is (``document``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "docs" / "real-bugs.json"
DOC = ROOT / "docs" / "real-bugs.md"
RUN_TIMEOUT_S = 1800
DECIDERS = ("engine", "modelled")  # decided_by: the engine's own code, or a kvwatch stand-in
REPOS = {
    "sglang": "sgl-project/sglang",
    "vllm": "vllm-project/vllm",
    "lightllm": "ModelTC/LightLLM",
}
# LightLLM is not on PyPI: its rows name commits, exported from this git repository (a
# clone or a bare git dir); without it they keep their last result and say so
LIGHTLLM_REPO = "KVWATCH_LIGHTLLM_REPO"
CHECKOUT_FLAG = "--lightllm-src"  # a row whose version is a commit of a source checkout
VLLM_PYTHON = ".venv-vllm/bin/python"  # what make vllm-release unpacks releases beside
# below this line docs/real-bugs.md is prose written by hand (a hunt's write-up), kept
HAND_WRITTEN = "<!-- written by hand below this line; make real-bugs keeps it -->"


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


def _judged(summary: dict, expect: str | None) -> Side | None:
    """The failing detector of a gate's summary (``expect`` first) and its evidence."""
    failed: dict[str, str] = {}
    for run in summary.get("runs", ()):
        for name, verdict in run.get("detectors", {}).items():
            if verdict.get("verdict") == "fail":
                failed.setdefault(name, verdict.get("evidence", ""))
    if not failed:
        return None
    name = expect if expect in failed else next(iter(failed))
    return Side(exit=1, detector=name, evidence=failed[name])


def side_of(code: int, summary: dict | None, expect: str | None, output: str) -> Side:
    """What one run showed: its exit code, the failing detector and its evidence."""
    judged = _judged(summary or {}, expect)
    if judged is not None:
        return judged._replace(exit=code)
    if code == 0:
        return Side(exit=0, detector=None, evidence="")
    errors = [r["error"] for r in (summary or {}).get("runs", ()) if r.get("error")]
    tail = output.strip().splitlines()[-1:] or ["no output"]
    return Side(exit=code, detector=None, evidence=errors[0] if errors else tail[0])


def checkout(repo: Path, commit: str, where: Path) -> Path:
    """``commit`` of the git repository ``repo``, exported once under ``where``
    (``git archive``: no work tree or ``.git`` of its own)."""
    folder = where / f"checkout-{commit[:12]}"
    if not folder.exists():
        folder.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "-C", str(repo), "archive", "--format=tar", commit],
            capture_output=True, check=True,
        )  # fmt: skip
        subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def run_side(row: BugRow, version: str, where: Path) -> tuple[Side, float]:
    """One ``kvwatch gate`` process on ``version``; what it showed and its seconds."""
    out = where / f"{row.id}-{version}"
    started = time.monotonic()
    given = version
    if row.version_flag == CHECKOUT_FLAG:
        given = str(checkout(Path(os.environ[LIGHTLLM_REPO]), version, where))
    cmd = [sys.executable, "-m", "kvwatch", *row.argv(given, out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    side = side_of(done.returncode, summary, row.expect, done.stdout + done.stderr)
    return side, time.monotonic() - started


def run_row(row: BugRow, where: Path, say=print) -> BugRow:
    """``row`` with its ``result`` measured (unchanged when no gate drives it, or when
    its commits' repository is not given)."""
    if row.gate is None:
        return row
    if row.version_flag == CHECKOUT_FLAG and not os.environ.get(LIGHTLLM_REPO):
        say(f"{row.id}: not run: set {LIGHTLLM_REPO} to a LightLLM git repository")
        return row
    result = {}
    for name, version in (("buggy", row.buggy), ("fixed", row.fixed)):
        if version is None:
            continue
        result[name], seconds = run_side(row, version, where)
        side = result[name]
        say(f"{row.id}: {version} ({name}) exit {side.exit}, {side.detector} ({seconds:.1f} s)")
    return replace(row, result=result)


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


def _linked(row: BugRow, ref: str | None) -> str:
    """``PR #123`` / ``issue #45`` as a link to the engine's repository."""
    if not ref:
        return "-"
    repo = REPOS.get(row.engine)
    if repo is None:
        return ref

    def link(m: re.Match) -> str:
        kind = "pull" if m.group(1).lower() == "pr" else "issues"
        return f"[{m.group(0)}](https://github.com/{repo}/{kind}/{m.group(2)})"

    return re.sub(r"(PR|issue) #(\d+)", link, ref, flags=re.IGNORECASE)


def _outcome(side: Side | None) -> str:
    if side is None:
        return "not run"
    return f"exit {side.exit}" + (f", `{side.detector}`" if side.detector else "")


def _table(rows: Sequence[BugRow]) -> list[str]:
    lines = [
        "| bug | engine | fix | with the bug | with the fix | expected | decided by |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        result = r.result or {}
        bug = f"{r.buggy}: {_outcome(result.get('buggy'))}"
        fix = f"{r.fixed}: {_outcome(result.get('fixed'))}" if r.fixed else "no fix yet"
        lines.append(
            f"| [{r.id}](#{r.id}) | {r.engine} | {_linked(r, r.fix)} | {bug} | {fix} "
            f"| `{r.expect or '-'}` | {r.decided_by} |"
        )
    return lines


def _gated(row: BugRow) -> list[str]:
    out = []
    for name, version in (("buggy", row.buggy), ("fixed", row.fixed)):
        side = (row.result or {}).get(name)
        if version is None:
            continue
        out += ["", f"`{row.command(version)}` ({name}): {_outcome(side)}"]
        if side is not None and side.evidence:
            out += ["", f"> {side.evidence}"]
    return out


DECIDED = {
    "engine": "the engine's own code: its scheduler and caches as released.",
    "modelled": "a kvwatch stand-in for part of the engine (a scheduler shim): kept, not counted.",
}


def _section(row: BugRow) -> list[str]:
    refs = ", ".join(x for x in (_linked(row, row.fix), _linked(row, row.issue)) if x != "-")
    out = [
        f"### {row.id}",
        "",
        f"{row.engine} {row.buggy}" + (f" -> {row.fixed}" if row.fixed else ""),
    ]
    out[-1] += f" ({refs})" if refs else ""
    out += ["", row.summary, "", f"**Trigger.** {row.trigger}"]
    out += ["", f"**Decided by.** {DECIDED[row.decided_by]}"]
    if row.gate is not None:
        out += _gated(row)
    if row.note:
        out += ["", f"**Note.** {row.note}"]
    return [*out, ""]


def render(rows: Sequence[BugRow]) -> str:
    """Markdown: the table, then a section per fixed bug, then the suspected live ones."""
    fixed = [r for r in rows if r.fixed is not None]
    live = [r for r in rows if r.fixed is None]
    lines = [
        "# Real bugs",
        "",
        "Generated by `make real-bugs` (`python -m mutation.real_bugs`) from",
        "`docs/real-bugs.json`, and checked by `tests/mutation/test_real_bugs.py`. Each gated row is",
        "`kvwatch gate` run twice, on the release with the bug and on the release with the",
        "fix; the bug must exit 1 with the expected detector failing, the fix exit 0. The",
        "evidence is the failing detector's line from `summary.json`. A row counts only when",
        "the engine's own code decided both runs (`decided by: engine`); a `modelled` row's",
        "verdict comes from a kvwatch stand-in for part of the engine, and is kept but not",
        f"counted ({len(counted(rows))} rows count). Each row that counts has a swap test",
        "(`tests/targets/*/test_*_engine_decides.py`): what kvwatch plays of the engine (the",
        "model's tokens; SGLang's scheduler traits) is replaced, and both verdicts stay. The",
        "row schema is in `mutation/real_bugs.py` and `docs/README.md`.",
        "",
        "Each command below runs as written from the checkout's root once kvwatch is",
        "installed (`make .venv/.installed`, then `.venv/bin/kvwatch`, or `pip install .`);",
        "a vLLM row's command first unpacks the release over vLLM's own venv (`make",
        "vllm-release`), a LightLLM row's needs a checkout of the commit it names.",
        "",
        "## Fixed bugs",
        "",
        *_table(fixed),
        "",
    ]
    for row in fixed:
        lines += _section(row)
    if live:
        lines += ["## Suspected live bugs", "", *_table(live), ""]
        for row in live:
            lines += _section(row)
    return "\n".join(lines).rstrip("\n") + "\n"


def document(rows: Sequence[BugRow], previous: str = "") -> str:
    """``docs/real-bugs.md``: ``render(rows)``, then whatever ``previous`` (the document
    as it was) holds below ``HAND_WRITTEN``, kept as it is."""
    if HAND_WRITTEN not in previous:
        return render(rows)
    return render(rows) + "\n" + HAND_WRITTEN + previous.partition(HAND_WRITTEN)[2]


def generated(doc: str) -> str:
    """The part of a document ``render`` made (the hand-written part left out)."""
    return doc.partition("\n" + HAND_WRITTEN)[0]


def _chosen(row: BugRow, args: argparse.Namespace) -> bool:
    """Whether ``--only`` and ``--engine`` ask for ``row`` (every row when neither is given)."""
    return (not args.only or row.id in args.only) and (not args.engine or row.engine in args.engine)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS, help="default: docs/real-bugs.json")
    parser.add_argument("--out", type=Path, default=DOC, help="default: docs/real-bugs.md")
    parser.add_argument("--only", action="append", default=[], metavar="ID", help="rerun these")
    parser.add_argument(
        "--engine", action="append", default=[], help="rerun only these engines' rows"
    )
    parser.add_argument("--render", action="store_true", help="run nothing; render the markdown")
    args = parser.parse_args(argv)
    rows = load(args.corpus)
    if not args.render:
        with tempfile.TemporaryDirectory(prefix="kvwatch-real-bugs-") as tmp:
            rows = [run_row(r, Path(tmp)) if _chosen(r, args) else r for r in rows]
        save(rows, args.corpus)
    previous = args.out.read_text() if args.out.exists() else ""
    args.out.write_text(document(rows, previous))
    wrong = problems(rows)
    print(f"wrote {args.out}: {len(rows)} rows, {len(counted(rows))} count, {len(wrong)} wrong")
    for line in wrong:
        print(f"  {line}")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
