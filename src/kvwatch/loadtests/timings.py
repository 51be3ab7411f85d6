"""What each answered completion cost its client, counted from Locust's request events.

The users fire, for every completion that ended well, an ``E2E`` sample (the
whole request, first byte sent to last byte read) whose ``context`` carries
the usage the server returned (``prompt_tokens``, ``cached_tokens``,
``output_tokens``) and the finish reason, and for a stream a ``TTFT`` and an ``ITL`` sample
(``users.py``). This keeps every sample, in milliseconds, with the wall-clock
window the answered requests spanned; each process hands its ``Timings`` to
the END barrier with its request counts, and the gate turns the merged
samples into percentiles and rates (``gate/verdicts/performance.py``). Locust's own
stats CSV is not read: it is rewritten once a second and misses the last
second of a run.
"""

from __future__ import annotations

import time

from kvwatch.harness.run_record import Timings

SAMPLED = {"TTFT": "ttft_ms", "ITL": "itl_ms", "E2E": "e2e_ms"}


class TimingLog:
    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = {field: [] for field in SAMPLED.values()}
        self.tokens = {"prompt": 0, "cached": 0, "output": 0}
        self.finished: list[tuple[float, int]] = []  # (E2E ms, output tokens): stop or length
        self.first: float | None = None  # wall-clock start of the first answered request
        self.last: float | None = None  # and end of the last

    def listen(self, events) -> None:
        events.request.add_listener(self.on_request)

    def on_request(
        self, request_type: str, name: str, response_time=0.0, exception=None, context=None, **kw
    ) -> None:
        field = SAMPLED.get(request_type)
        if field is None or exception is not None:
            return
        self.samples[field].append(float(response_time))
        if request_type == "E2E":
            now = time.time()
            self.first = min(self.first or now, now - response_time / 1000)
            self.last = now
            usage = context or {}
            for key in self.tokens:
                self.tokens[key] += int(usage.get(f"{key}_tokens", 0) or 0)
            if usage.get("finish_reason") in ("stop", "length"):
                output = int(usage.get("output_tokens", 0) or 0)
                self.finished.append((float(response_time), output))

    def timings(self) -> Timings:
        return Timings(
            ttft_ms=tuple(self.samples["ttft_ms"]),
            itl_ms=tuple(self.samples["itl_ms"]),
            e2e_ms=tuple(self.samples["e2e_ms"]),
            finished=tuple(self.finished),
            prompt_tokens=self.tokens["prompt"],
            cached_tokens=self.tokens["cached"],
            output_tokens=self.tokens["output"],
            window=(self.first, self.last) if self.first is not None else None,
        )
