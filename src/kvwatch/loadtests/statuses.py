"""HTTP answers by status class, counted from Locust's request events in each process.

Every request Locust's client makes fires ``events.request`` with its
response; this counts them as ``2xx``, ``3xx``, ``4xx``, ``5xx`` or ``none``
(no answer: the connection failed). Derived samples (``TTFT``, ``ITL``) carry
no response and are not requests, so they are left out (``E2E`` too:
``timings.py`` keeps those); a broken turn
(``TURN``, the user's own code raised) is counted apart. Requests Locust
counted as failed are counted too. The first few failed requests and 5xx
answers are kept as evidence: the request's name, its status (0 when nothing
answered), the exception Locust recorded and the start of the body.

Locust's own stats CSV is rewritten once a second and not at shutdown, so it
can miss the last requests of a run; these counts are exact wherever they are
read:

* a turn run: every user hands its process's counts to the END barrier once
  its last request is done, and the coordinator keeps the largest per process
  (``record.merge_counts``), the count when that process's last user arrived;
* a soak: when Locust quits (after every user's ``on_stop``), the counts go
  to a JSON file, with when each user ended each episode (``episode_ended``,
  wall-clock seconds)::

    {"status": {"2xx": 1200, "4xx": 3, "5xx": 0, "none": 0}, "failed": 3,
     "broken_turns": 0, "first_failures": [{"name": "agent turn", "status": 500, "error": "...", "body": "..."}],
     "episode_ends": [[0, 1767100000.25], [1001, 1767100001.5], ...]}
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

from kvwatch.harness.run_record import KEEP_FAILURES, Counts

SAMPLES = frozenset({"TTFT", "ITL", "E2E"})
BROKEN_TURN = "TURN"


def failpoint_refusal(status: int, message: str) -> bool:
    """True for the answer to a request the server failed at a failpoint: the
    cache failed an allocation on purpose (the gate turns failpoints on), and
    a request that could not go on answers 400 (or, streamed, an error event)
    naming it. Expected, not a failure; anything else that goes wrong still is."""
    return status in (200, 400) and "(failpoint " in message


class StatusCounts:
    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else None  # written when Locust quits
        self.status: Counter[str] = Counter()
        self.failed = 0
        self.broken_turns = 0
        self.first_failures: list[dict] = []
        self.episode_ends: list[tuple[int, float]] = []  # (user index, time.time())

    def listen(self, events) -> None:
        events.request.add_listener(self.on_request)
        if self.path is not None:
            events.quitting.add_listener(self.on_quitting)

    def on_request(
        self, request_type: str, name: str, response=None, exception=None, **kwargs
    ) -> None:
        if request_type in SAMPLES:
            return
        if request_type == BROKEN_TURN:
            self.broken_turns += 1
            return
        self.failed += exception is not None
        code = getattr(response, "status_code", None) or 0
        self.status[f"{code // 100}xx" if code else "none"] += 1
        if (exception is not None or code >= 500) and len(self.first_failures) < KEEP_FAILURES:
            body = getattr(response, "text", "") or ""
            error = _describe(exception) if exception is not None else ""
            self.first_failures.append(
                {"name": name, "status": code, "error": error, "body": body[:300]}
            )

    def counts(self) -> Counts:
        return Counts(
            status=dict(self.status),
            failed=self.failed,
            broken_turns=self.broken_turns,
            first_failures=tuple(self.first_failures),
        )

    def episode_ended(self, user: int) -> None:
        self.episode_ends.append((user, time.time()))

    def on_quitting(self, **kwargs) -> None:
        data = {**self.counts().to_json(), "episode_ends": self.episode_ends}
        self.path.write_text(json.dumps(data, indent=2) + "\n")


def _describe(exception: BaseException) -> str:
    """The exception as one line: its type, and its message when it has one
    (a refused connection's message names the address; some errors have none)."""
    text = " ".join(str(exception).split())
    return f"{type(exception).__name__}: {text}"[:200] if text else type(exception).__name__
