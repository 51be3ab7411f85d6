"""equivalence: every comparable request (greedy, or sampled with a seed) replayed
with the cache off must give the tokens the cached run gave."""

from __future__ import annotations

from kvwatch.gate.verdicts.detectors.verdict import Evidence, Verdict, fail, passed, skipped
from kvwatch.harness.run_record import RunRecord, Signal

ID = "equivalence"
NEEDS = frozenset({Signal.REPLAYS})


def detect(run: RunRecord) -> Verdict:
    if not run.replays:
        return skipped(ID, "no replays")
    bad = sorted((r for r in run.replays if r.cached != r.reference), key=lambda r: r.turn)
    if not bad:
        of = f" of {run.finished} finished requests" if run.finished else ""
        return passed(ID, f"{len(run.replays)}{of} equal their cache-off replays")
    ev = []
    for r in bad:
        at = next(
            (i for i, (a, b) in enumerate(zip(r.cached, r.reference, strict=False)) if a != b),
            min(len(r.cached), len(r.reference)),
        )
        ev.append(
            Evidence(
                group=None,
                pages=(),
                detail=f"a {len(r.prompt)}-token prompt: output differs from the cache-off replay at token {at} "
                f"({list(r.cached[at : at + 4])} vs {list(r.reference[at : at + 4])})",
            )
        )
    return fail(ID, bad[0].turn, ev)
