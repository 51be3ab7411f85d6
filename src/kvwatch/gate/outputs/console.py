"""A judged run's result lines, as ``kvwatch gate`` prints them on stdout::

    agentic-trie c=4: 159 requests, 0 failed
        FAIL allocator at turn 3: full.kv: 12 pinned pages, live holders (4) justify 9
        FAIL heap after the drain: engine/records.py:125: ...
        NOTICE ref_mismatch at turn 0: lightllm.kv: the root's ref_counter ... (by design)

``Progress.run_finished`` (``harness/progress.py``) prints them under the run's
name; the verdict side writes them, since only it knows what a verdict is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvwatch.gate.verdicts.judge import RunResult

if TYPE_CHECKING:
    from kvwatch.harness.progress import Lane, Progress


def told(progress: Progress | Lane, result: RunResult) -> None:
    """``result`` printed by ``progress`` as a finished run: its name and lines."""
    progress.run_finished(result.profile, result.concurrency, result_lines(result))


def result_lines(result: RunResult) -> list[str]:
    """A judged run: its requests, then each failed detector with its evidence,
    each detector that raised, and each notice (a broken invariant its engine holds
    harmless: reported, no detector fails on it)."""
    if result.error and not result.verdicts:
        return [f"ERROR: {result.error}"]
    head = f"{result.requests} requests, {result.errors} failed"
    numbers = [result.performance.line()] if result.performance is not None else []
    failed = [line for name, v in result.failed().items() for line in _failure(name, v)]
    crashed = [f"ERROR {name} raised: {_evidence(v)}" for name, v in result.errored().items()]
    broke = [f"ERROR: {result.error}"] if result.error else []
    noted = [f"NOTICE {f.kind} at turn {t}: {f.detail}" for t, f in result.notices]
    if not (failed or crashed or broke):
        return [f"{head}; every detector passed", *filter(None, numbers), *noted]
    return [head, *filter(None, numbers), *failed, *crashed, *broke, *noted]


def _failure(name: str, verdict) -> list[str]:
    """``FAIL name at turn t: evidence``; with a story, the story on that line and
    the evidence on the next."""
    if not verdict.story:
        return [f"FAIL {name} {_at(verdict)}: {_evidence(verdict)}"]
    return [f"FAIL {name} {_at(verdict)}: {verdict.story}", f"    {_evidence(verdict)}"]


def _at(verdict) -> str:
    return "after the drain" if verdict.after_drain else f"at turn {verdict.first_turn}"


def _evidence(verdict) -> str:
    return verdict.headline() if verdict.evidence else verdict.note
