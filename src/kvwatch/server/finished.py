"""FinishedLog: the requests the engine finished that a cache-off engine must reproduce.

A request is *comparable* when its output is a function of its prompt and
its parameters alone: greedy, or sampled with a seed (every request samples
from a generator of its own). With ``--enable-probe`` the worker logs each
comparable request that finished (``stop`` or ``length``, no error) with its
prompt as the engine saw it (a session turn's prompt is the session's
tokens) and its output; ``GET /debug/finished`` hands them over and forgets
them. The equivalence check replays them on a cache-off engine.

The log keeps at most ``MAX_KEPT`` entries between two reads (the oldest go
first and are counted as ``dropped``), so a server nobody reads stays bounded.
"""

from __future__ import annotations

import threading
from collections import deque
from types import MappingProxyType
from typing import NamedTuple

from kvwatch.engine.request import SamplingParams

MAX_KEPT = 8192


class FinishedRequest(NamedTuple):
    prompt: tuple[int, ...]
    output: tuple[int, ...]
    params: SamplingParams

    def to_json(self) -> dict:
        p = self.params
        return {
            "prompt": list(self.prompt),
            "output": list(self.output),
            "max_tokens": p.max_tokens,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "seed": p.seed,
            "stop_token_ids": list(p.stop_token_ids),
            "ignore_eos": p.ignore_eos,
        }


def comparable(params: SamplingParams) -> bool:
    return params.greedy or params.seed is not None


class FinishedLog:
    # at most MAX_KEPT between two reads (registry walks check the bound)
    __bounded__ = MappingProxyType({"_kept": MAX_KEPT})

    def __init__(self) -> None:
        self._kept: deque[FinishedRequest] = deque(maxlen=MAX_KEPT)
        self._lock = threading.Lock()
        self._finished = self._dropped = 0

    def add(self, prompt: list[int], output: list[int], params: SamplingParams) -> None:
        """A request that finished well; kept when it is comparable."""
        with self._lock:
            self._finished += 1
            if not comparable(params):
                return
            self._dropped += len(self._kept) == MAX_KEPT
            self._kept.append(FinishedRequest(tuple(prompt), tuple(output), params))

    def take(self) -> dict:
        """Everything kept since the previous call, and how many finished in all."""
        with self._lock:
            kept, self._kept = list(self._kept), deque(maxlen=MAX_KEPT)
            out = {
                "requests": [r.to_json() for r in kept],
                "finished": self._finished,
                "dropped": self._dropped,
            }
            self._finished = self._dropped = 0
        return out
