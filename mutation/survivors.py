"""What would catch each mutant the gate let through, by mutant id, and why no
program reaches an unreached line, by ``file:function``.

Written by hand after reading the runs: the parts of
``docs/mutation-score.md`` that are not generated.
"""

from __future__ import annotations

NOTES: dict[str, str] = {
    "engine/scheduler.py:10": (
        "When a placement in the middle of a step retracts a victim that was already given "
        "work in that step, the victim's work stays in the batch and the model runner meets "
        "a request that holds no pages (a 500 on that request). The gate's profiles never "
        "place a newer request before an older one runs out of pages in the same step; a "
        "profile whose pools are sized so that a new admission and the decode growth of the "
        "running requests exhaust them together at c >= 4 would, and the in-process fuzz "
        "(radix-pressure) does."
    ),
    "engine/scheduler.py:17": (
        "A request that fails in the engine does not end its session's turn, so the "
        "session's next turn is refused as 'already has a turn in flight'. No gate profile "
        "makes a session request fail in the engine (a prompt larger than the pool can "
        "ever hold) and then goes on with that session; a chaos step that does would turn "
        "the refusal into a failed request for the requests detector."
    ),
}


UNREACHED: dict[str, str] = {}
