"""The gate's section of BENCHMARKS.md, from pytest-benchmark's JSON of tests/gate/test_bench_gate.py.

``benchmarks_md.py`` renders it inside the whole file (``make bench``);
``make bench-gate`` reruns only the gate's benchmark and puts a fresh section
in place of the old one::

    python tests/helpers/gate_md.py GATE.json BENCHMARKS.md

Invariants: the section starts at ``HEADING`` and ends before the next
``## `` heading (or the end of the file), so replacing it leaves every other
line as it was; each tier's wall time is the median of its rounds, every
round shown; the catch rates come from ``docs/mutation-score.json``, the
mutants both tiers were run on.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from md_section import measured, replace_section

HEADING = "## The gate's time"
BENCH = "test_gate_wall_time"
COMMAND = "make bench-gate"
TARGETS = {"default": 300.0, "quick": 90.0}  # seconds on 2 cores
MUTATION_SCORE = Path(__file__).resolve().parents[2] / "docs" / "mutation-score.json"
# the lanes' phases, in the order a run goes; "load" is the turns' time less their
# barriers' (warmup_s + turns_s - settle_s - barrier_s: the clients' requests while
# the engine computes them)
PHASES = {
    "server_start_s": "servers starting (one per profile)",
    "load_start_s": "Locust starting, users set up, baseline probe",
    "load_s": "load: the turns' requests, served",
    "settle_s": "barriers: waiting for the engine to finish what the clients left",
    "barrier_s": "barriers: probes, audits, flushes, heap samples at the idle engine",
    "drain_s": "sessions closed, drained, flushed, last probe",
    "load_stop_s": "Locust stopping, record handed over",
    "replay_s": "cache-off replay (the gate's process)",
}
RUN_COLUMNS = ("run_s", "load_s", "settle_s", "barrier_s", "drain_s", "replay_s", "step_s")


def with_load(spent: dict) -> dict:
    """``spent`` with ``load_s``: the turns' time less their barriers' (never below 0)."""
    turns = spent.get("warmup_s", 0) + spent.get("turns_s", 0)
    barriers = spent.get("settle_s", 0) + spent.get("barrier_s", 0)
    return {**spent, "load_s": max(0.0, turns - barriers)}


HOW = [
    "A lane is one profile's server, its Locust runs and its replays; `--jobs` (one per core) "
    "runs that many lanes side by side, so the lanes' seconds add up to more than the wall "
    "time. Before lanes, the default gate ran its 32 runs one after another: 8 min 34 s on "
    "these 2 cores (2026-11-26, 253 CPU seconds in the servers and 62 in the gate's process "
    "over 513 s: one core was idle for most of it, through barriers, drains, idle timeouts "
    "and start-ups). Two lanes keep both cores busy; the chaos profile's session idle timeout "
    "went from 15 s to 5 s, since each chaos run waited for it to reap a session (13 of its "
    "20 s at c = 1). Neither changes what a run does or how it is judged: each fault of the "
    "registry fails `kvwatch gate --quick --profile P --inject F` on the profile that exposes "
    "it, 11 of 11 (checked by hand on 2026-11-26), and `make matrix` runs every fault through "
    "the default gate's concurrencies.",
    "",
    "Cuts since, each measured on the default tier at seed 1 on these 2 cores with nothing "
    "else running (wall time with the report), none changing what a run sends or how it is "
    "judged: (1) `kvwatch serve`'s listening socket names TCP as its protocol, so asyncio "
    "sets TCP_NODELAY on each connection; before, every answer on a kept-alive connection "
    "waited for the client's delayed ACK, about 40 ms a request: 338 s -> 301 s (the quick "
    "tier's own elapsed time 73 s -> 61 s). (2) A scrape of `/metrics` reads the engine "
    "afresh, so a reader at a barrier no longer sleeps 0.1 s before each scrape to get "
    "past the gauges' cache (two or "
    "three scrapes a barrier): the barriers' lane time 121 s -> 58 s, the wall 301 s -> "
    "266 s. (3) A heap snapshot first waits for the span file's batch in flight (a "
    "correctness fix the faster barriers exposed: a batch half-written counted as a leak).",
]


def _runs(data: dict) -> dict[str, dict]:
    return {
        b["extra_info"]["tier"]: b["extra_info"]
        for b in data["benchmarks"]
        if b["name"].startswith(BENCH) and "rounds" in b["extra_info"]
    }


def _clock(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s"


def catch_rates(path: Path = MUTATION_SCORE) -> dict[str, str]:
    """Each tier's share of the alive mutants it caught, from the score's data."""
    if not path.exists():
        return {}
    mutants = json.loads(path.read_text())["mutants"]
    alive = [m for m in mutants if m["alive"]]
    quick = sum((m["caught_by"] or "").startswith("fast") for m in alive)
    every = sum(bool(m["caught_by"]) for m in alive)
    return {
        "quick": f"{quick} of {len(alive)} ({100 * quick / len(alive):.0f}%)",
        "default": f"{every} of {len(alive)} ({100 * every / len(alive):.0f}%)",
    }


def _rounds(rounds: list[dict]) -> str:
    """Each round's wall time, with the seed it ran (``--seed``) where it has one."""
    return ", ".join(
        f"{r['wall_s']} s" + (f" (seed {r['seed']})" if "seed" in r else "") for r in rounds
    )


def _tiers(tiers: dict[str, dict]) -> list[str]:
    rates = catch_rates()
    lines = [
        "| tier | command | runs | wall, median | every round | target (2 cores) | met | mutants caught |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for tier, i in tiers.items():
        target = TARGETS.get(tier)
        met = (
            "-" if target is None or i["cores"] != 2 else ("yes" if i["wall_s"] <= target else "NO")
        )
        command = f"kvwatch gate {i['flags']}".strip()
        lines.append(
            f"| {tier} | `{command}` | {i['rounds'][0]['runs']} "
            f"| {_clock(i['wall_s'])} | {_rounds(i['rounds'])} "
            f"| {_clock(target) if target else '-'} | {met} | {rates.get(tier, '-')} |"
        )
    return lines


def _ratio(seconds: float, compute: float) -> str:
    return f"{seconds / compute:.2f}" if compute > 0 else "-"


def _profile(i: dict) -> list[str]:
    """Where one round of the tier went: the phases summed over its runs, each also
    per second of the engine's own compute (its steps' CPU over the same runs: a ratio
    the machine's speed scales on both sides)."""
    r = i["rounds"][0]
    total = with_load(r["sum"])
    lanes = total.get("run_s", 0) + total.get("server_start_s", 0)
    compute = total.get("step_s", 0)
    lines = [
        "| phase | seconds, all runs | share of lane time | per second of engine compute |",
        "|---|---|---|---|",
    ]
    named = 0.0
    for key, what in PHASES.items():
        named += total.get(key, 0)
        lines.append(
            f"| {what} | {total.get(key, 0):.1f} | {100 * total.get(key, 0) / lanes:.0f}% "
            f"| {_ratio(total.get(key, 0), compute)} |"
        )
    rest = max(0.0, lanes - named)
    lines += [
        f"| the rest (coverage, arming, record, judging) | {rest:.1f} | {100 * rest / lanes:.0f}% "
        f"| {_ratio(rest, compute)} |",
        f"| **lanes, end to end** | **{lanes:.1f}** | 100% | **{_ratio(lanes, compute)}** |",
        "",
        f"The servers' engine threads over those runs (CPU seconds): {int(total.get('steps', 0))} "
        f"steps; {compute:.1f} s in engine steps (the engine's own compute), "
        f"{total.get('watch_s', 0):.1f} s in the probe after every step (`/debug/watch`), "
        f"{total.get('calls_s', 0):.1f} s in calls between steps (barrier and mid-turn probes, "
        "heap samples, census, flushes, coverage). After the runs (summary, report) and before "
        f"them (imports): {max(0.0, r['wall_s'] - r['gate_s']):.1f} s of the {r['wall_s']} s "
        "wall time.",
        "",
        "Per profile, its server and runs end to end (s): "
        + ", ".join(f"{p} {s}" for p, s in sorted(r["profiles"].items(), key=lambda kv: -kv[1])),
    ]
    return lines + _per_run(r.get("runs_time", []))


def _per_run(runs: list[dict]) -> list[str]:
    """Each run's phases (s) and its wall time per second of its engine's compute."""
    if not runs:
        return []
    lines = [
        "",
        "| profile | c | run | load | settle | barriers | drain | replay | engine compute "
        "| run per second of compute |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        spent = with_load(run)
        cells = " | ".join(f"{spent.get(k, 0):.1f}" for k in RUN_COLUMNS)
        lines.append(
            f"| {run['profile']} | {run['c']} | {cells} "
            f"| {_ratio(spent.get('run_s', 0), spent.get('step_s', 0))} |"
        )
    return lines


def section(data: dict, *, quiet: bool = False) -> list[str]:
    tiers = _runs(data)
    if not tiers:
        return []
    lines = [
        HEADING,
        "",
        measured(data, COMMAND, quiet=quiet)
        + ": each tier as one `kvwatch gate` process with its report, as CI runs it. The mutants caught "
        "are each tier's on the mutation score's sample (docs/mutation-score.md: the quick tier "
        "is the score's first stage; the default column counts every stage).",
        "",
        *_tiers(tiers),
        "",
        *HOW,
    ]
    for tier, i in tiers.items():
        lines += ["", f"Where the {tier} tier's time went (its first round):", "", *_profile(i)]
    return lines


def main(argv: list[str]) -> int:
    data = json.loads(Path(argv[0]).read_text())
    doc = Path(argv[1])
    new = section(data, quiet=os.environ.get("KVWATCH_BENCH_QUIET") == "1")
    if not new:
        print(f"no {BENCH} results with KVWATCH_BENCH_GATE=tiers in {argv[0]}", file=sys.stderr)
        return 1
    doc.write_text(replace_section(doc.read_text(), HEADING, new))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
