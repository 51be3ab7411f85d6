"""bad-input: malformed requests mixed with valid chats and cold prompts.

Every malformed request must get a 4xx with an OpenAI-style error body
(``{"error": {"message": ..., "type": ...}}``); anything else is a failure in
Locust's stats. The valid traffic around it (a chat, and prompts that share
nothing with the cache, so every lookup misses) is what the leak detectors
then judge: bad input must leave nothing behind.
"""

from __future__ import annotations

import json

from kvwatch.loadtests.turns import Chat, TurnUser, parallel
from kvwatch.loadtests.users import sentence

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]

# (name, path, body as raw bytes or a JSON-able value)
CASES: tuple[tuple[str, str, object], ...] = (
    ("not json", CHAT, b'{"model": "m", "messages": ['),
    ("body is a list", CHAT, [1, 2, 3]),
    ("no messages", CHAT, {"model": "m"}),
    ("empty messages", CHAT, {"model": "m", "messages": []}),
    ("unknown role", CHAT, {"model": "m", "messages": [{"role": "wizard", "content": "x"}]}),
    ("content is a number", CHAT, {"model": "m", "messages": [{"role": "user", "content": 7}]}),
    ("negative max_tokens", CHAT, {"model": "m", "messages": MSG, "max_tokens": -1}),
    ("temperature too high", CHAT, {"model": "m", "messages": MSG, "temperature": 9}),
    ("n > 1", CHAT, {"model": "m", "messages": MSG, "n": 4}),
    ("stop strings", CHAT, {"model": "m", "messages": MSG, "stop": ["\n"]}),
    ("unknown session", CHAT, {"model": "m", "messages": MSG, "session_id": "no-such-session"}),
    ("malformed session id", CHAT, {"model": "m", "messages": MSG, "session_id": "../../etc"}),
    ("token id out of range", "/v1/completions", {"model": "m", "prompt": [1, 2, 10**9]}),
    ("negative token id", "/v1/completions", {"model": "m", "prompt": [-5]}),
    ("empty prompt", "/v1/completions", {"model": "m", "prompt": ""}),
    ("prompt too long", "/v1/completions", {"model": "m", "prompt": [65] * 5000}),
    ("rollback unknown session", "/v1/sessions/nope/rollback", {"steps": 1}),
)


class BadInputUser(TurnUser):
    def setup(self) -> None:
        self.chats = [Chat([self.system])]

    def turn(self, t: int) -> None:
        picks = self.rng.sample(range(len(CASES)), 4)

        def step() -> None:
            self.chats[0].step(self, sentence(self.rng), name="agent turn")

        def cold() -> None:  # shares nothing with the cache: a miss on every lookup
            prompt = [{"role": "user", "content": sentence(self.rng, 3, 12)}]
            self.chat(prompt, name="cold prompt")

        parallel(step, cold, *(lambda i=i: self.malformed(*CASES[i]) for i in picks))

    def malformed(self, name: str, path: str, body: object) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        with self.client.post(
            path, data=data, headers=headers, name=f"bad: {name}", catch_response=True
        ) as resp:
            if not 400 <= resp.status_code < 500:
                resp.failure(f"want a 4xx, got {resp.status_code}: {resp.text[:200]}")
                return
            try:
                error = resp.json()["error"]
                assert isinstance(error["message"], str) and error["type"]
            except (ValueError, KeyError, TypeError, AssertionError):
                resp.failure(f"not an OpenAI-style error body: {resp.text[:200]}")
                return
            resp.success()

    def conversations(self) -> int:
        return 1

    def context_tokens(self) -> int:
        return self.chats[0].tokens
