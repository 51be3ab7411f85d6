"""What a recorded session's trajectory must say, from what its client was answered.

An RL trainer reads ``GET /v1/sessions/{id}/trajectory`` and trains on the
tokens its loss mask marks: they must be exactly the tokens the policy
generated, where the session holds them. The client knows both without the
tokenizer: each turn answered ``usage.prompt_tokens`` (the session's length
when the turn began, so where its output starts) and, with
``return_token_ids``, the output's token ids. A rollback takes the last turn
back. So the mask covers ``[start, start + len(output))`` of each kept turn
and nothing else, and the trajectory's tokens there are the outputs::

    token_ids  | system user A | out 1 | tag user B | out 2 |
    loss_mask  | 0 ........... | 1 1 1 | 0 ........ | 1 1 1 |
                                 ^ start 1 = prompt_tokens of turn 1

A mask that starts a token early or late trains on the wrong tokens while
serving stays correct, so no leak detector or output replay would see it.
"""

from __future__ import annotations

from collections.abc import Sequence

Turn = tuple[int, Sequence[int]]  # (where the output starts, its token ids)


def trajectory_problem(trajectory: dict, turns: Sequence[Turn]) -> str | None:
    """Why ``trajectory`` (the endpoint's JSON) disagrees with the kept ``turns``,
    or None when it agrees."""
    ids, mask = trajectory.get("token_ids") or [], trajectory.get("loss_mask") or []
    if len(ids) != len(mask):
        return f"trajectory: {len(ids)} tokens but a loss mask of {len(mask)}"
    want = [i for start, out in turns for i in range(start, start + len(out))]
    marked = [i for i, m in enumerate(mask) if m]
    if marked != want:
        pairs = enumerate(zip(marked, want, strict=False))
        at = next((i for i, (a, b) in pairs if a != b), min(len(marked), len(want)))
        return (
            f"trajectory: the loss mask marks {len(marked)} tokens, the {len(turns)} kept turns "
            f"generated {len(want)}; the first output token at {want[at] if at < len(want) else '-'}"
            f" is marked at {marked[at] if at < len(marked) else '-'}"
        )
    for start, out in turns:
        if list(ids[start : start + len(out)]) != list(out):
            return f"trajectory: the tokens at {start} are not the output the turn answered"
    return None
