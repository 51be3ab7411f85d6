"""bad-input: malformed requests mixed with valid chats and cold prompts.

Each case is judged by what an OpenAI-compatible server must answer
(``Case``): an invalid request gets a 4xx with an OpenAI-style error body
(``{"error": {"message": ..., "type": ...}}``), a valid one that an engine
lacks the feature for may be refused the same way; anything else is a failure
in the run's request counts. Every body names the served model (``--model``),
so nothing is refused for naming another. The valid traffic around it (a
chat, and prompts that share nothing with the cache, so every lookup misses)
is what the leak detectors then judge: bad input must leave nothing behind.
"""

from __future__ import annotations

from kvwatch.loadtests.badcases import Case, body_of, cases_for, context_of, judge
from kvwatch.loadtests.turns import Chat, TurnUser, parallel
from kvwatch.loadtests.users import sentence


class BadInputUser(TurnUser):
    def setup(self) -> None:
        self.chats = [Chat([self.system])]
        self.engine = self.plan.gauges.name
        cases = cases_for(self.engine)
        self.cases = [c for c in cases if not c.required]
        self.required = [c for c in cases if c.required]
        self.context_len: int | None = None

    def turn(self, t: int) -> None:
        """Four cases drawn at random; the required ones (a prompt that fills the context)
        in the first turn, a warm-up one: what the long prefill adds for good (a pressure
        transition's first series) is then in the baseline the judged turns start from."""
        picks = self.rng.sample(self.cases, 4) + (self.required if t == 0 else [])

        def step() -> None:
            self.chats[0].step(self, sentence(self.rng), name="agent turn")

        def cold() -> None:  # shares nothing with the cache: a miss on every lookup
            prompt = [{"role": "user", "content": sentence(self.rng, 3, 12)}]
            self.chat(prompt, name="cold prompt")

        parallel(step, cold, *(lambda c=c: self.malformed(c) for c in picks))

    def malformed(self, case: Case) -> None:
        data = body_of(case, self.model, self.served_context)
        headers = {"Content-Type": "application/json"}
        with self.client.post(
            case.path, data=data, headers=headers, name=f"bad: {case.name}", catch_response=True
        ) as resp:
            if (wrong := judge(case, self.engine, resp.status_code, resp.text or "")) is None:
                resp.success()
            else:
                resp.failure(wrong)

    def served_context(self) -> int:
        """The served model's context in tokens, as ``/v1/models`` reports it
        (``max_model_len``, which kvwatch and vLLM both give)."""
        if self.context_len is None:
            with self.client.get("/v1/models", name="models", catch_response=True) as resp:
                self.context_len = context_of(resp.json, self.model)
                resp.success()
        return self.context_len

    def conversations(self) -> int:
        return 1

    def context_tokens(self) -> int:
        return self.chats[0].tokens
