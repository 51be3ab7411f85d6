"""The history tier: generated histories played on a target, judged, shrunk and saved.

``hunt(target, seeds, plan, out)`` plays one generated history per seed on a
fresh loop (``play.py``), judges it (``checks.py``) and, for each history
that fails, shrinks it to a small one that shows the same bug (the first
raise, else the first finding: ``HistoryVerdict.primary``) and that the plan
allows (``shrink.py``), and writes it as ``<out>/history-<seed>.json``::

    {"format": 1, "target": {...describe()}, "seed": 3,
     "failed": ["content"], "findings": [[check, detail, rid], ...],
     "history": {...History.to_json()}, "replay": "kvwatch histories --replay <file>"}

``replay_file(path)`` plays a saved history again on the target it names and
judges it: what a maintainer runs to see the finding.

Invariant: every history is played on a loop made for it alone, so a
history's verdict depends on its seed, plan and target only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from kvwatch.histories.checks import HistoryVerdict, judge
from kvwatch.histories.generate import Plan, generate
from kvwatch.histories.ops import History
from kvwatch.histories.play import Played, play
from kvwatch.histories.played_json import played_from_json
from kvwatch.histories.shrink import shrink
from kvwatch.histories.targets import target_from
from kvwatch.targets.driver.history_target import (
    HistoryTarget,
    LoopHistoryTarget,
    ProcessHistoryTarget,
)

FORMAT = 1


class HistoryRun(NamedTuple):
    seed: int
    ops: int
    steps: int
    verdict: HistoryVerdict
    seconds: float
    shrunk: History | None = None  # the smallest failing history found (failures only)
    shrunk_verdict: HistoryVerdict | None = None
    plays: int = 0  # histories played to shrink it
    saved: Path | None = None


def play_on(target: HistoryTarget, history: History) -> tuple[Played, str]:
    """``history`` on a fresh engine of ``target``: played here on a new loop, or in the
    target's driver process; with what that engine calls a request it ended unasked."""
    if isinstance(target, ProcessHistoryTarget):
        data = target.answer(history.to_json())
        return played_from_json(data["played"]), data["unasked"]
    assert isinstance(target, LoopHistoryTarget)
    loop = target.make_loop()
    try:
        played = play(loop, target.make_probe(loop), history, target.make_watch(loop))
    finally:
        loop.close()
    return played, loop.unasked


def run_history(target: HistoryTarget, history: History) -> tuple[Played, HistoryVerdict]:
    """``history`` on a fresh engine of ``target``, judged."""
    played, unasked = play_on(target, history)
    return played, judge(played, unasked, target.reference())


def save_history(
    path: Path,
    target: HistoryTarget,
    seed: int,
    history: History,
    verdict: HistoryVerdict,
    **extra: object,
) -> None:
    """``history`` and its verdict as a file ``kvwatch histories --replay`` plays."""
    data = {
        "format": FORMAT,
        "target": target.describe(),
        "seed": seed,
        "failed": sorted(verdict.failed),
        "findings": [list(f) for f in verdict.findings],
        "history": history.to_json(),
        "steps": [op.describe() for op in history.ops],
        "replay": f"kvwatch histories --replay {path.name}",
        **extra,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


def hunt(
    target: HistoryTarget,
    seeds: Sequence[int],
    plan: Plan,
    out: Path | None = None,
    shrink_budget: int = 200,
    say: Callable[[str], None] = lambda line: None,
) -> list[HistoryRun]:
    """One generated history per seed; failures shrunk, and saved under ``out``."""
    with target.opened():
        return [_hunt_one(target, seed, plan, out, shrink_budget, say) for seed in seeds]


def _hunt_one(
    target: HistoryTarget,
    seed: int,
    plan: Plan,
    out: Path | None,
    shrink_budget: int,
    say: Callable[[str], None],
) -> HistoryRun:
    """One history: generated, played, judged; a failure shrunk and saved."""
    start = time.perf_counter()
    history = generate(target.shape, seed, plan)
    played, verdict = run_history(target, history)
    run = HistoryRun(
        seed=seed, ops=len(history.ops), steps=played.steps, verdict=verdict, seconds=0.0
    )
    if verdict.findings:
        wanted = verdict.primary or ""

        def fails(h: History) -> bool:
            """The same bug (``HistoryVerdict.primary``), in a history the plan allows."""
            return plan.allows(h) and run_history(target, h)[1].shows(wanted)

        shrunk, plays = shrink(history, fails, shrink_budget)
        run = run._replace(
            shrunk=shrunk, shrunk_verdict=run_history(target, shrunk)[1], plays=plays
        )
        if out is not None:
            path = out / f"history-{seed}.json"
            save_history(path, target, seed, shrunk, run.shrunk_verdict)  # type: ignore[arg-type]
            run = run._replace(saved=path)
    run = run._replace(seconds=time.perf_counter() - start)
    say(_line(run))
    return run


def _line(run: HistoryRun) -> str:
    head = f"seed {run.seed}: {run.ops} operations, {run.steps} steps"
    if not run.verdict.findings:
        return f"{head}: every check passed ({run.seconds:.1f} s)"
    small = f"shrunk to {len(run.shrunk.ops)} operations in {run.plays} plays" if run.shrunk else ""
    return (
        f"{head}: FAIL {', '.join(sorted(run.verdict.failed))}; {small} ({run.seconds:.1f} s)"
        + (f" -> {run.saved}" if run.saved else "")
    )


def replay_file(path: Path, src: str | None = None) -> tuple[History, Played, HistoryVerdict]:
    """A saved history played again on the target it names, judged; ``src``: another
    source checkout of the same engine (LightLLM's) than the one it was saved on."""
    data = json.loads(Path(path).read_text())
    if data.get("format") != FORMAT:
        raise ValueError(f"{path}: not a saved history of format {FORMAT}")
    history = History.from_json(data["history"])
    target = target_from({**data["target"], **({"src": src} if src else {})})
    with target.opened():
        played, verdict = run_history(target, history)
    return history, played, verdict
