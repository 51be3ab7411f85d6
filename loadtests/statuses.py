"""HTTP answers by status class, counted from Locust's request events, for a soak.

Every request Locust's client makes fires ``events.request`` with its
response; this counts them as ``2xx``, ``3xx``, ``4xx``, ``5xx`` or ``none``
(no answer: the connection failed). Derived samples (``TTFT``, ``ITL``) and
broken turns carry no response and are not requests, so they are left out.
Requests Locust counted as failed are counted too. The first few 5xx answers
are kept as evidence. Users also say when each of their episodes ended
(``episode_ended``), in wall-clock seconds, so the soak can judge usage over
whole episodes whatever the machine's speed. When Locust quits (after every
user's ``on_stop``, which its stats CSV may miss), it all goes to a JSON file::

    {"status": {"2xx": 1200, "4xx": 3, "5xx": 0, "none": 0}, "failed": 3,
     "first_5xx": [{"name": "agent turn", "status": 500, "body": "..."}],
     "episode_ends": [[0, 1767100000.25], [1001, 1767100001.5], ...]}
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

KEEP_5XX = 5
NOT_REQUESTS = frozenset({"TTFT", "ITL", "TURN"})


class StatusCounts:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.counts: Counter[str] = Counter()
        self.failed = 0
        self.first_5xx: list[dict] = []
        self.episode_ends: list[tuple[int, float]] = []  # (user index, time.time())

    def listen(self, events) -> None:
        events.request.add_listener(self.on_request)
        events.quitting.add_listener(self.on_quitting)

    def on_request(
        self, request_type: str, name: str, response=None, exception=None, **kwargs
    ) -> None:
        if request_type in NOT_REQUESTS:
            return
        self.failed += exception is not None
        code = getattr(response, "status_code", None) or 0
        self.counts[f"{code // 100}xx" if code else "none"] += 1
        if code >= 500 and len(self.first_5xx) < KEEP_5XX:
            body = getattr(response, "text", "") or ""
            self.first_5xx.append({"name": name, "status": code, "body": body[:300]})

    def episode_ended(self, user: int) -> None:
        self.episode_ends.append((user, time.time()))

    def on_quitting(self, **kwargs) -> None:
        data = {
            "status": dict(self.counts),
            "failed": self.failed,
            "first_5xx": self.first_5xx,
            "episode_ends": self.episode_ends,
        }
        self.path.write_text(json.dumps(data, indent=2) + "\n")
