"""Render BENCHMARKS.md from pytest-benchmark's JSON (``make bench`` runs this).

    python tests/helpers/benchmarks_md.py benchmarks.json > BENCHMARKS.md

Every figure comes from the JSON of one run; ratios (c = 8 against c = 1,
OTel on against off) were measured inside that same run. The peer section
(kvwatch against SGLang's caches) is peer_md.py's, which ``make bench-peer``
also writes on its own.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import gate_md
import peer_md

MUTATION_SCORE = Path(__file__).resolve().parents[2] / "docs" / "mutation-score.json"


class Target(NamedTuple):
    what: str
    limit: str
    met: Callable[[float], bool]


TARGETS = {
    "overhead": Target("instrumentation overhead", "<= 3 %", lambda v: v <= 3.0),
    "audit_1m": Target("full audit of a 1M-page pool", "<= 100 ms", lambda v: v <= 100.0),
    "efficiency": Target("prefill computed / unique tokens", "<= 1.1", lambda v: v <= 1.1),
    "batching": Target("tokens/s at c = 8 / c = 1", ">= 3", lambda v: v >= 3.0),
}


def _by_name(data: dict) -> dict[str, dict]:
    return {b["name"]: b for b in data["benchmarks"]}


def _ms(bench: dict, stat: str = "mean") -> float:
    return bench["stats"].get(stat, bench["stats"]["mean"]) * 1000


def _row(target: Target, value: float | None, shown: str) -> str:
    if value is None:
        return f"| {target.what} | not measured | {target.limit} | - |"
    return f"| {target.what} | {shown} | {target.limit} | {'yes' if target.met(value) else 'NO'} |"


def _prefill_notes(effs: list[dict]) -> list[str]:
    out = []
    for eff in effs:
        if not eff.get("page_aligned_ideal"):
            continue
        unique, ideal = eff["unique_tokens"], eff["page_aligned_ideal"]
        out += [
            "",
            f"Prefill at {eff['page']}-token pages: the trace has {unique} unique prompt tokens; "
            f"an ideal cache that resumes only at page boundaries computes {ideal} "
            f"({ideal / unique:.3f} of unique), the floor for this page size. The engine computed "
            f"{eff['computed_tokens']} ({eff['ratio_to_page_aligned_ideal']} of that floor); "
            f"without shared-prefix waits it computed {eff.get('computed_without_waits')}.",
        ]
    return out


def render(data: dict) -> str:
    b = _by_name(data)
    machine = data.get("machine_info", {})
    lines = [
        "# Benchmarks",
        "",
        f"Measured {data.get('datetime', '')[:19]} on {machine.get('cpu', {}).get('brand_raw', 'cpu')}"
        f" ({machine.get('cpu', {}).get('count', '?')} cores), Python {machine.get('python_version', '?')}.",
        "Reproduce with `make bench` (it writes `benchmarks.json` and this file).",
        "",
        "## Targets",
        "",
        "| measure | result | target | met |",
        "|---|---|---|---|",
    ]
    overhead = b.get("test_instrumentation_overhead", {}).get("extra_info", {})
    pct = overhead.get("overhead_pct")
    lines.append(_row(TARGETS["overhead"], pct, f"{pct} %" if pct is not None else ""))
    audit = b.get("test_audit_cost[1000000]")
    ms = _ms(audit) if audit else None
    lines.append(_row(TARGETS["audit_1m"], ms, f"{ms:.1f} ms" if ms else ""))
    effs = [
        bench["extra_info"]
        for name, bench in b.items()
        if name.startswith("test_prefill_computed_against_unique_tokens")
    ]
    effs.sort(key=lambda info: -info.get("page", 0))
    for eff in effs or [{}]:
        target = TARGETS["efficiency"]
        if "page" in eff:
            target = target._replace(what=f"{target.what}, {eff['page']}-token pages")
        lines.append(_row(target, eff.get("ratio"), str(eff.get("ratio"))))
    batch = b.get("test_continuous_batching_c8_against_c1", {}).get("extra_info", {})
    lines.append(_row(TARGETS["batching"], batch.get("ratio"), f"{batch.get('ratio')}x"))
    lines += ["", peer_md.POINTER]
    lines += _prefill_notes(effs)
    lines += [
        "",
        "## Cache operations",
        "",
        "| benchmark | pages | nodes | mean | median |",
        "|---|---|---|---|---|",
    ]
    for name, bench in b.items():
        if name.startswith(("test_audit_cost", "test_probe_cost")):
            info = bench["extra_info"]
            lines.append(
                f"| {name} | {info.get('pages')} | {info.get('nodes')} "
                f"| {_ms(bench):.2f} ms | {_ms(bench, 'median'):.2f} ms |"
            )
    radix = b.get("test_radix_match_and_insert", {}).get("extra_info", {})
    if radix:
        lines += [
            "",
            f"Radix cache on the agentic-trie trace ({radix['requests']} requests, "
            f"{radix['prompt_tokens']} prompt tokens): match {radix['match_ops_per_s']} ops/s, "
            f"insert (commit_chunk) {radix['insert_ops_per_s']} ops/s.",
        ]
    lines += ["", *peer_md.section(data)]
    lines += ["", "## Engine", "", "| benchmark | figures |", "|---|---|"]
    for name in (
        "test_decode_throughput[1]",
        "test_decode_throughput[8]",
        "test_continuous_batching_c8_against_c1",
        "test_prefill_computed_against_unique_tokens[16]",
        "test_prefill_computed_against_unique_tokens[8]",
        "test_instrumentation_overhead",
    ):
        if name in b:
            info = ", ".join(f"{k} {v}" for k, v in b[name]["extra_info"].items())
            lines.append(f"| {name} | {info} |")
    gate = gate_md.section(data)
    if gate:
        lines += ["", *gate]
    return "\n".join(lines + mutation_section(MUTATION_SCORE)) + "\n"


def mutation_section(path: Path) -> list[str]:
    """The gate's score on generated mutants (``make mutate``), from its JSON."""
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    mutants = data["mutants"]
    alive = [m for m in mutants if m["alive"]]
    caught = [m for m in alive if m["caught_by"]]
    share = f"{100 * len(caught) / len(alive):.0f}%" if alive else "-"
    sample = data["meta"].get("sample")
    judged = f"{len(mutants)} of {data['meta']['sites']}" if sample else str(len(mutants))
    return [
        "",
        "## Mutation score",
        "",
        "Mutants generated from the lifecycle code (`make mutate`, docs/mutation-score.md).",
        "",
        "| mutants judged | alive | caught by the gate | score | survivors |",
        "|---|---|---|---|---|",
        f"| {judged} | {len(alive)} | {len(caught)} | {share} | {len(alive) - len(caught)} |",
    ]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: benchmarks_md.py BENCHMARKS.json", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        sys.stdout.write(render(json.load(f)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
