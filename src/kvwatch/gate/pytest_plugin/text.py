"""The pytest plugin's words: a failing test's message, the ``kvwatch leak gate``
report section, and the line per gated test of the terminal summary.

The summary is printed where the reports end up (the controller, under
pytest-xdist), so what it needs travels on the call report itself: a JSON
``user_properties`` entry named ``SUMMARY_PROPERTY`` (``summary_entry``),
read back by ``summary_lines``. The section is text and travels as text.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvwatch.gate.pytest_plugin.gated import GateOutcome
    from kvwatch.gate.verdicts.detectors import Verdict

SECTION = "kvwatch leak gate"
SUMMARY_PROPERTY = "kvwatch_leak_gate"
PAGES_SHOWN = 8
FRAMES_SHOWN = 4


def evidence_lines(verdict: Verdict, indent: str = "  ") -> list[str]:
    """Each piece of evidence on its own line: ``[group] detail pages [...]``, then
    the last frames of its traceback, if it has one."""
    lines = []
    for e in verdict.evidence:
        where = f"[{e.group}] " if e.group else ""
        pages = f" pages {list(e.pages)[:PAGES_SHOWN]}" if e.pages else ""
        lines.append(f"{indent}{where}{e.detail}{pages}")
        lines += [f"{indent}  {frame}" for frame in e.traceback[-FRAMES_SHOWN:]]
    return lines


def _at(verdict: Verdict) -> str:
    if verdict.errored:
        return "while judging"
    return "after the drain" if verdict.after_drain else f"at turn {verdict.first_turn}"


def format_failures(verdicts: Iterable[Verdict], *, errors: bool = False) -> str:
    """``kvwatch detector 'ID' failed at turn N:`` and its evidence, per failing
    verdict (with ``errors``, a detector that raised counts as failing)."""
    from kvwatch.gate.pytest_plugin.gated import BOUND_ID

    lines = []
    for v in verdicts:
        if v.failed or (errors and v.errored):
            kind = "bound" if v.detector == BOUND_ID else "detector"
            lines.append(f"kvwatch {kind} {v.detector!r} failed {_at(v)}:")
            lines += evidence_lines(v)
    return "\n".join(lines)


def failure_message(outcome: GateOutcome) -> str:
    """The ``longrepr`` of a test whose body passed and whose gate did not."""
    if outcome.error:
        return f"kvwatch leak gate could not judge the test: {outcome.error}"
    return format_failures(outcome.failures, errors=True)


def _header(outcome: GateOutcome) -> str:
    if outcome.turns == 0:
        recorded = (
            "no barrier recorded: only the probe after the test was judged (the drain "
            "rule, its findings); a detector with no turn to judge says skipped"
        )
    else:
        barriers = "1 barrier" if outcome.turns == 1 else f"{outcome.turns} barriers"
        recorded = f"{barriers} recorded (warm-up: the first {outcome.warmup})"
    return f"{recorded}; after the test: {outcome.after}"


def section_text(outcome: GateOutcome) -> str:
    """The report section: what was recorded, then every verdict with its note, or
    its evidence when it failed."""
    if outcome.error:
        return f"could not judge the test: {outcome.error}"
    width = max((len(v.detector) for v in outcome.verdicts), default=0)
    lines = [_header(outcome)]
    for v in outcome.verdicts:
        word = v.verdict.upper() if v.failed or v.errored else v.verdict
        if v.failed or v.errored:
            lines.append(f"{v.detector:<{width}}  {word:<7}  {_at(v)}")
            lines += evidence_lines(v, indent=" " * (width + 4))
            lines += [f"{' ' * (width + 4)}{v.story}"] if v.story else []
        else:
            lines.append(f"{v.detector:<{width}}  {word:<7}  {v.note}".rstrip())
    return "\n".join(lines)


def summary_entry(outcome: GateOutcome) -> str:
    """What the terminal summary needs of one test, as JSON: turns, each verdict and,
    for a failing one, its first line of evidence."""
    verdicts = [
        [v.detector, v.verdict, v.summary() if v.failed or v.errored else ""]
        for v in outcome.verdicts
    ]
    return json.dumps({"turns": outcome.turns, "verdicts": verdicts, "error": outcome.error})


def summary_lines(nodeid: str, entry: str) -> list[str]:
    """``PASS|FAIL nodeid (N turns): id verdict, ...`` and, under a failing test, one
    line per failing verdict: where it failed and its first evidence."""
    data = json.loads(entry)
    verdicts = data["verdicts"]
    failing = [v for v in verdicts if v[1] in ("fail", "error")]
    state = "FAIL" if failing or data["error"] else "PASS"
    listed = ", ".join(
        f"{name} {word.upper() if word in ('fail', 'error') else word}"
        for name, word, _ in verdicts
    )
    turns = {0: "no barrier: drain only", 1: "1 turn"}.get(data["turns"], f"{data['turns']} turns")
    lines = [f"{state} {nodeid} ({turns}): {listed or 'no detector'}"]
    lines += [f"    {name}: {line}" for name, _, line in failing]
    lines += [f"    could not judge: {data['error']}"] if data["error"] else []
    return lines
