"""``mixed``: the hunt's seeded load on vLLM's scheduler, in whatever layout the plan names.

Each turn runs ``steps`` steps (the plan's ``steps``, else ``STEPS``) in which,
at random from the plan's seed, requests arrive, leave and stream:

- a new request with probability 0.5 a step: 70% start with one of three
  shared prefixes of 24, 40 and 72 tokens (ending inside 16-, 32- and
  64-token blocks), then 1..40 tokens of their own; 15% carry one of two
  cache salts; priorities 0..3 (read only under priority scheduling);
  1..24 tokens to generate;
- an abort storm with probability 0.08: one to three live requests that are
  not sessions;
- a streaming-input chunk with probability 0.1: one of ``concurrency``
  sessions (``resumable`` requests under one id) opens or sends its next
  chunk, sometimes while the last one still runs (vLLM queues it), each
  chunk ending one token short of a 16-token boundary; a session closes
  after 2 to 8 chunks, and its id opens a new one;
- a forced prefix-cache reset with probability 0.01 (``Core.reset``:
  ``reset_prefix_cache(reset_running_requests=True)``, what a weight
  update's pause with ``clear_cache`` calls), whatever is running;

then the turn drains. Sessions close in ``close``. Invariant: the same seed,
layout and release give the same requests in the same steps.
"""

from __future__ import annotations

import random

from kvwatch.targets.vllm.workloads import Workload

STEPS = 40
PREFIXES = (
    list(range(40000, 40024)),
    list(range(41000, 41040)),
    list(range(42000, 42072)),
)


class Mixed(Workload):
    name = "mixed"
    summary = "seeded mix: shared prefixes ending mid-block, salts, abort storms, streamed sessions"
    sessions = True

    def __init__(self, seed: int = 0, steps: int | None = None) -> None:
        super().__init__(seed, steps)
        self.rng, self.made = random.Random(seed), 0
        self.open: dict[str, int] = {}  # session -> chunks it may still send

    def settings(self, concurrency: int) -> dict:
        return {"block_size": 16, "num_blocks": 12 + 6 * concurrency}

    def tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(100, 60000) for _ in range(n)]

    def arrive(self, core, turn: int) -> None:
        rng = self.rng
        head = list(rng.choice(PREFIXES)) if rng.random() < 0.7 else []
        extra = {"priority": rng.randrange(4)}
        if rng.random() < 0.15:
            extra["cache_salt"] = rng.choice(("salt-a", "salt-b"))
        self.made += 1
        tokens = head + self.tokens(rng.randint(1, 40))
        core.submit(f"mix-{turn}-{self.made}", tokens, rng.randint(1, 24), **extra)

    def storm(self, core) -> None:
        live = sorted(r for r in core.scheduler.requests if r.startswith("mix-"))
        for rid in self.rng.sample(live, min(len(live), self.rng.randint(1, 3))):
            core.abort(rid)

    def stream(self, core, concurrency: int) -> None:
        """A session's next chunk; a session that sent its last one closes (a chunk that
        is not resumable) and the next under its id is a new session."""
        sid = f"session-{self.rng.randrange(concurrency)}"
        if sid in self.open and self.open[sid] == 0:
            del self.open[sid]
            core.submit(sid, [7], 1, resumable=False)
            return
        if sid not in self.open and sid in core.scheduler.requests:
            return  # its close is still queued behind a chunk
        first = sid not in self.open
        chunk = self.tokens(15 if first else 16)
        core.submit(sid, chunk, 1, resumable=True)
        self.open[sid] = self.rng.randint(1, 7) if first else self.open[sid] - 1

    def turn(self, core, turn: int, concurrency: int) -> None:
        for _ in range(self.steps or STEPS):
            draw = self.rng.random()
            if draw < 0.5:
                self.arrive(core, turn)
            elif draw < 0.58:
                self.storm(core)
            elif draw < 0.68:
                self.stream(core, concurrency)
            elif draw < 0.69:
                core.reset()
            if core.busy():
                core.step()
        core.run()

    def close(self, core, concurrency: int) -> None:
        for sid in sorted(self.open):
            if sid in core.scheduler.requests:
                core.submit(sid, [7], 1, resumable=False)
        core.run()


MIXED_WORKLOADS: dict[str, type[Workload]] = {Mixed.name: Mixed}
