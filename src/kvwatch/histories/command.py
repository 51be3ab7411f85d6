"""``kvwatch histories``: the history tier from the command line.

``run(options)`` hunts one generated history per seed on the chosen engine,
prints a line per history (and the steps of each shrunk failure), and
writes ``<out>/summary.json`` and one ``history-<seed>.json`` per failure;
``replay(path)`` plays a saved history again; ``export_replay`` writes a saved
vLLM history as a script for vLLM alone. Both return the exit code:
0 every check passed, 1 a check failed, 2 a usage error (raised as
``ValueError`` by the options, reported by the CLI).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from kvwatch import streams
from kvwatch.histories.generate import Plan
from kvwatch.histories.hunt import HistoryRun, hunt, replay_file
from kvwatch.histories.targets import target_from
from kvwatch.targets.driver.history_target import HistoryTarget


@dataclass(frozen=True)
class HistoryOptions:
    engine: str = "kvwatch"
    version: str | None = None  # an SGLang or vLLM release (--engine sglang, vllm)
    setup: str | None = None  # its setup (targets/{sglang,vllm,lightllm}/histories.SETUPS)
    src: str | None = None  # a LightLLM checkout (--engine lightllm)
    seeds: tuple[int, ...] = (0, 1, 2)
    turns: int = 4
    ops: int = 12  # operations per turn
    turns_apart: bool = False  # never two turns of one session at the same step
    sets: tuple[str, ...] = ()
    faults: tuple[str, ...] = ()
    out: Path = Path("kvwatch-histories")
    shrink_budget: int = 200


def parse_seeds(text: str) -> tuple[int, ...]:
    """``0-9``, ``3`` or ``1,4,7`` (and mixes: ``0-2,9``) as seeds, in order."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            seeds.extend(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise ValueError(f"--seeds {text!r}: want seeds like 0-9, 3 or 1,4,7") from None
    if not seeds:
        raise ValueError(f"--seeds {text!r} names no seed")
    return tuple(seeds)


def _summary(
    options: HistoryOptions, target: HistoryTarget, runs: list[HistoryRun], seconds: float
) -> dict:
    return {
        "target": target.describe(),
        "plan": {
            "turns": options.turns,
            "ops_per_turn": options.ops,
            "turns_apart": options.turns_apart,
        },
        "verdict": "fail" if any(r.verdict.findings for r in runs) else "pass",
        "seconds": round(seconds, 1),
        "histories": [
            {
                "seed": r.seed,
                "operations": r.ops,
                "steps": r.steps,
                "failed": sorted(r.verdict.failed),
                "skipped": [list(s) for s in r.verdict.skipped],
                "shrunk_operations": len(r.shrunk.ops) if r.shrunk else None,
                "saved": r.saved.name if r.saved else None,
                "seconds": round(r.seconds, 2),
            }
            for r in runs
        ],
    }


def _target(options: HistoryOptions) -> HistoryTarget:
    """The engine the options name; ValueError for flags that do not go with it."""
    own = options.engine in ("kvwatch", "kvwatch-http")
    if own and (options.version or options.setup):
        raise ValueError("a release and a setup go with --engine sglang, vllm or lightllm")
    if options.engine != "lightllm" and options.src:
        raise ValueError("--lightllm-src goes with --engine lightllm")
    if options.engine == "lightllm" and options.version:
        raise ValueError("--engine lightllm takes a checkout (--lightllm-src), not a release")
    if not own and (options.sets or options.faults):
        raise ValueError("--engine-set and --inject go with --engine kvwatch or kvwatch-http")
    return target_from(
        {
            "engine": options.engine,
            "sets": options.sets,
            "faults": options.faults,
            "version": options.version,
            "setup": options.setup,
            "src": options.src,
        }
    )


def run(options: HistoryOptions) -> int:
    target = _target(options)
    plan = Plan(
        turns=options.turns, ops_per_turn=options.ops, same_step_turns=not options.turns_apart
    )
    start = time.perf_counter()
    runs = hunt(target, options.seeds, plan, options.out, options.shrink_budget, streams.out)
    for r in runs:
        if r.shrunk is not None and r.shrunk_verdict is not None:
            streams.out(f"  seed {r.seed}, shrunk:")
            for op in r.shrunk.ops:
                streams.out(f"    {op.describe()}")
            for f in r.shrunk_verdict.findings:
                streams.out(f"    FAIL {f.check}: {f.detail}")
    summary = _summary(options, target, runs, time.perf_counter() - start)
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    failed = sum(1 for r in runs if r.verdict.findings)
    streams.out(
        f"verdict: {summary['verdict']} ({failed} of {len(runs)} histories failed, "
        f"{summary['seconds']} s) -> {options.out}"
    )
    return 1 if failed else 0


def export_replay(saved: Path | None, out: Path) -> int:
    """``--replay FILE --export OUT.py``: the saved vLLM history as a script that replays it
    with vLLM alone (``targets/vllm/export.py``); ValueError without a saved history."""
    if saved is None:
        raise ValueError("--export goes with --replay FILE")
    from kvwatch.targets.vllm.export import export

    export(saved, out)
    streams.out(f"wrote {out}: run it with the Python that has the vLLM release")
    return 0


def replay(path: Path, src: str | None = None) -> int:
    history, played, verdict = replay_file(path, src)
    for op in history.ops:
        streams.out(op.describe())
    for f in verdict.findings:
        streams.out(f"FAIL {f.check}: {f.detail}")
    for check, why in verdict.skipped:
        streams.out(f"skipped {check}: {why}")
    streams.out(f"verdict: {'fail' if verdict.findings else 'pass'} ({played.steps} steps)")
    return 1 if verdict.findings else 0
