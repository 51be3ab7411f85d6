"""The loads ``--engine vllm-scheduler`` runs on vLLM's own scheduler, one per profile.

Each is a few lines of what users send, in turns: at concurrency c, c
conversations each do something per turn; the turn ends when nothing they
sent has work left. What they exercise is only reachable from inside vLLM's
engine core, so no HTTP profile sends it:

``priority``
    ``--scheduling-policy priority`` with asynchronous scheduling (vLLM's
    default on GPU: the engine core schedules a step while the one before is
    in flight). Each turn a low-priority request arrives first and runs one
    step; c - 1 high-priority ones follow into a pool that cannot hold them
    all, so the scheduler preempts while the low-priority one is in its last
    step, and skipped. Every running request must be scheduled or preempted
    in a step that has budget left (``running-skipped``).
``streaming-input``
    c streaming-input sessions (``AsyncLLM.generate`` with an async generator
    of inputs: one resumable request per chunk under one id). Each chunk ends
    one token short of a block and asks for one token, which completes the
    block; the next chunk replaces that token. Beside each session a reader
    asks for the session's old text. Every request's block hashes must be
    those of its tokens (``request-hash-stale``, ``block-hash-vs-tokens``,
    ``hit-on-other-tokens``).
``waves``
    c requests a turn, half of them sharing a prefix, run to completion:
    whatever the KV managers keep per step must be empty when nothing runs,
    and no container may outgrow the pool (``scratch-not-drained``,
    ``scratch-over-pool``, and the quiescence detector's registry sizes).

A workload only submits requests (``core.submit``, the ``EngineLoop``
contract of ``kvwatch.targets.driver``) and runs ``core`` (``loop.Core``, which
owns the scheduler and the checks) until it is idle; it imports nothing from
vLLM. The
profiles that turn on other KV cache layouts (hybrid groups, fine hashing,
events) are in ``layout_workloads.py``, the hunt's seeded mix in
``mixed_load.py``; ``sched_profiles.WORKLOADS`` names them all.
"""

from __future__ import annotations

from typing import ClassVar

BLOCK = 16


class Workload:
    name: ClassVar[str]
    summary: ClassVar[str]
    sessions: ClassVar[bool] = False  # keeps sessions open between turns

    def __init__(self, seed: int = 0, steps: int | None = None) -> None:
        self.seed, self.steps = seed, steps  # ``steps``: a budget for loads that take one

    def settings(self, concurrency: int) -> dict:
        """The scheduler's options (``scheduler_build.build``)."""
        return {"block_size": BLOCK, "num_blocks": 8 + 4 * concurrency}

    def turn(self, core, turn: int, concurrency: int) -> None:
        """Send what turn ``turn`` sends and run the core until it is done."""
        raise NotImplementedError

    def close(self, core, concurrency: int) -> None:
        """End what the conversations keep open (sessions); nothing by default."""

    def context_tokens(self, core) -> int:
        """Tokens the live requests hold."""
        return sum(r.num_tokens for r in core.scheduler.requests.values())


class Priority(Workload):
    name = "priority"
    summary = "priority scheduling, two steps in flight, a low-priority request preempted"

    def settings(self, concurrency: int) -> dict:
        # 7 blocks: the pool is full while the low-priority request decodes its last
        # token at c >= 4 (5 at c = 3); every request fits alone
        blocks = 5 if concurrency == 3 else 7
        return {"block_size": BLOCK, "num_blocks": blocks, "policy": "priority", "in_flight": 2}

    def turn(self, core, turn: int, concurrency: int) -> None:
        base = 10_000 * (turn + 1)
        low = range(base + 500, base + 514)
        core.submit(f"low-{turn}", list(low), 3, priority=9)
        core.step()  # the low-priority request heads the running list
        for i in range(concurrency - 1):
            start = base + 2000 + 100 * i
            tokens = list(range(start, start + BLOCK - 1 + i))
            core.submit(f"high-{turn}-{i}", tokens, 40, priority=0)
        core.run()


class StreamingInput(Workload):
    name = "streaming-input"
    summary = "streaming-input sessions whose next chunk replaces a token that completed a block"
    sessions = True

    def __init__(self, seed: int = 0, steps: int | None = None) -> None:
        super().__init__(seed, steps)
        self.told: dict[str, list[int]] = {}  # session -> its tokens when the last chunk ended

    def turn(self, core, turn: int, concurrency: int) -> None:
        for i in range(concurrency):
            sid = f"session-{i}"
            if turn == 0:  # a first chunk one token short of a block
                chunk = [1000 * (i + 1) + k for k in range(BLOCK - 1)]
            else:  # one block more, so the session again ends one token short of one
                chunk = [1000 * (i + 1) + 100 * turn + k for k in range(BLOCK)]
            core.submit(sid, chunk, 1, resumable=True)
            if sid in self.told:  # a reader of what the session said before this chunk
                tail = [9000 + 10 * i + turn, 9001 + 10 * i]
                core.submit(f"reader-{turn}-{i}", self.told[sid] + tail, 1)
        core.run()
        for i in range(concurrency):
            session = core.scheduler.requests.get(f"session-{i}")
            if session is not None:
                self.told[f"session-{i}"] = list(session.all_token_ids)

    def close(self, core, concurrency: int) -> None:
        for i in range(concurrency):
            if f"session-{i}" in core.scheduler.requests:
                core.submit(f"session-{i}", [7], 1, resumable=False)
        core.run()


class Waves(Workload):
    name = "waves"
    summary = "waves of requests, half sharing a prefix, each run to completion"

    def turn(self, core, turn: int, concurrency: int) -> None:
        shared = list(range(5000, 5000 + 2 * BLOCK))
        for i in range(concurrency):
            own = 7000 + 100 * i + 1000 * turn
            head = shared if i % 2 == 0 else list(range(own, own + 2 * BLOCK))
            tokens = head + list(range(100 * turn + 10 * i, 100 * turn + 10 * i + 8))
            core.submit(f"wave-{turn}-{i}", tokens, 20)
        core.run()


WORKLOADS: dict[str, type[Workload]] = {w.name: w for w in (Priority, StreamingInput, Waves)}
