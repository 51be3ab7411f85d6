"""Locust entry point: ``locust -f loadtests/locustfile.py --host URL``.

Exposes the concrete users; each takes its shape from ``users.py``.
"""

from __future__ import annotations

from locust import task

from kvwatch.loadtests.users import AgentUser, StreamingChatUser, sentence


class ChatUser(StreamingChatUser):
    """One-shot chats over a shared system prompt."""

    system = "You are the storage agent of a serving team. Answer briefly. " * 2

    @task
    def chat(self) -> None:
        messages = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": sentence(self.rng)},
        ]
        self.stream_chat(messages, name="chat")


class SessionAgent(AgentUser):
    pass
