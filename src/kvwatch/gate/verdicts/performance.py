"""A run's performance in numbers, from what its clients measured.

Per run, from the answered completions' ``Timings`` (``harness/run_record.py``):
time to first token, inter-token latency and end to end at p50, p90 and p99,
answered requests and output tokens per second over the window the answered
requests spanned, and the prefix cache's hit rate as the server's usage
reported it (cached prompt tokens over prompt tokens). The same figures go to
summary.json, the console's run lines and the report's table::

    TTFT p50/p90/p99 42/88/130 ms; ITL 9/14/30 ms; e2e 0.21/0.40/0.93 s;
    31.2 req/s, 250 output tok/s; prefix cache hit 71%
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kvwatch.harness.run_record import Timings

QUANTILES = (50, 90, 99)


class Percentiles(NamedTuple):
    p50: float  # seconds
    p90: float
    p99: float

    @classmethod
    def of(cls, samples_ms) -> Percentiles | None:
        if not len(samples_ms):
            return None
        p50, p90, p99 = np.percentile(np.asarray(samples_ms) / 1000, QUANTILES)
        return cls(p50=float(p50), p90=float(p90), p99=float(p99))

    def text(self, unit: str) -> str:
        scale = 1000 if unit == "ms" else 1
        digits = 0 if unit == "ms" else 2
        return "/".join(f"{v * scale:.{digits}f}" for v in self) + f" {unit}"


class Performance(NamedTuple):
    requests: int  # answered completions
    ttft: Percentiles | None
    itl: Percentiles | None
    e2e: Percentiles | None
    requests_per_s: float | None
    output_tokens_per_s: float | None
    prefix_hit_rate: float | None  # cached prompt tokens / prompt tokens

    @classmethod
    def of(cls, t: Timings) -> Performance:
        span = (t.window[1] - t.window[0]) if t.window else 0.0
        return cls(
            requests=len(t.e2e_ms),
            ttft=Percentiles.of(t.ttft_ms),
            itl=Percentiles.of(t.itl_ms),
            e2e=Percentiles.of(t.e2e_ms),
            requests_per_s=len(t.e2e_ms) / span if span > 0 else None,
            output_tokens_per_s=t.output_tokens / span if span > 0 else None,
            prefix_hit_rate=t.cached_tokens / t.prompt_tokens if t.prompt_tokens else None,
        )

    def line(self) -> str:
        parts = [
            f"{name} p50/p90/p99 {p.text(unit)}"
            for name, p, unit in (("TTFT", self.ttft, "ms"), ("ITL", self.itl, "ms"))
            if p is not None
        ]
        if self.e2e is not None:
            parts.append(f"e2e {self.e2e.text('s')}")
        rates = []
        if self.requests_per_s is not None:
            rates.append(f"{self.requests_per_s:.1f} req/s")
        if self.output_tokens_per_s is not None:
            rates.append(f"{self.output_tokens_per_s:.0f} output tok/s")
        if rates:
            parts.append(", ".join(rates))
        if self.prefix_hit_rate is not None:
            parts.append(f"prefix cache hit {self.prefix_hit_rate:.0%}")
        return "; ".join(parts)

    def as_dict(self) -> dict:
        def seconds(p: Percentiles | None) -> dict | None:
            return None if p is None else {k: round(v, 6) for k, v in p._asdict().items()}

        return {
            "requests": self.requests,
            "ttft_s": seconds(self.ttft),
            "itl_s": seconds(self.itl),
            "e2e_s": seconds(self.e2e),
            "requests_per_s": _rounded(self.requests_per_s),
            "output_tokens_per_s": _rounded(self.output_tokens_per_s),
            "prefix_cache_hit_rate": _rounded(self.prefix_hit_rate),
        }

    @classmethod
    def from_json(cls, data: dict | None) -> Performance | None:
        if not data:
            return None

        def seconds(p: dict | None) -> Percentiles | None:
            return None if p is None else Percentiles(**p)

        return cls(
            requests=data["requests"],
            ttft=seconds(data.get("ttft_s")),
            itl=seconds(data.get("itl_s")),
            e2e=seconds(data.get("e2e_s")),
            requests_per_s=data.get("requests_per_s"),
            output_tokens_per_s=data.get("output_tokens_per_s"),
            prefix_hit_rate=data.get("prefix_cache_hit_rate"),
        )


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
