"""Drive streaming sessions through an engine, turn by turn, as agents would."""

from __future__ import annotations

import random
from collections.abc import Callable

from kvwatch.engine import Engine, SamplingParams
from kvwatch.engine.model.tokenizer import ASSISTANT, BOS, END, SYSTEM, USER
from kvwatch.engine.views import ComputedBatch


def user_turn(rng: random.Random, n: int) -> list[int]:
    return [USER, *(rng.randrange(32, 127) for _ in range(n)), END, ASSISTANT]


def system_prompt(rng: random.Random, n: int) -> list[int]:
    return [BOS, SYSTEM, *(rng.randrange(32, 127) for _ in range(n)), END]


class SessionDriver:
    """Runs many sessions concurrently: each turn, every session sends one prompt."""

    def __init__(
        self,
        engine: Engine,
        sessions: int,
        *,
        seed: int = 0,
        record: bool = False,
        routed_experts: bool = False,
        system_len: int = 60,
    ) -> None:
        self.engine = engine
        self.rng = random.Random(seed)
        system = system_prompt(self.rng, system_len)
        self.ids = [
            engine.open_session(record=record, routed_experts=routed_experts)
            for _ in range(sessions)
        ]
        self.history = {sid: list(system) for sid in self.ids}

    def turn(
        self,
        params: SamplingParams,
        *,
        user_len: tuple[int, int] = (6, 24),
        after_step: Callable[[Engine], None] | None = None,
    ) -> list[tuple[str, list[int], list[int]]]:
        """One turn of every session; returns (session, prompt, output) per session."""
        engine = self.engine
        prompts = {
            sid: self.history[sid] + user_turn(self.rng, self.rng.randint(*user_len))
            for sid in self.ids
        }
        rids = {sid: engine.add_request(prompts[sid], params, session_id=sid) for sid in self.ids}
        while engine.has_unfinished():
            engine.step()
            if after_step:
                after_step(engine)
        out = []
        for sid in self.ids:
            done = engine.take(rids[sid])
            assert done.error is None, done.error
            self.history[sid] = list(engine.session_tokens(sid))
            out.append((sid, prompts[sid], done.token_ids))
        return out


def abort_mid_verify(engine: Engine, after_tokens: int) -> Callable[[ComputedBatch], None]:
    """A hook for ``Engine.on_batch_computed`` that aborts a session turn in the
    middle of a verify step, once it has generated ``after_tokens`` tokens."""

    def hook(batch: ComputedBatch) -> None:
        for rid in batch.verifying:
            req = engine.request_info(rid)
            if req.session_id is not None and req.output_tokens >= after_tokens:
                engine.abort(rid)

    return hook
