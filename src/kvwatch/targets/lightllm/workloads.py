"""Seeded token-level workloads for LightLLM's infer loop: the profiles of ``--engine lightllm-cache``.

Each workload sizes the pools and the start args (``sizes``); each ``turn``
submits its requests, all at once so they share the loop's batches, steps
the loop until it is idle and says how many conversations are live and how
many tokens they hold. Tokens come from one seeded ``Random``: a
(workload, cache, c, seed) is the same run on every checkout. The linear
cache runs with hash pages of 4 tokens and big pages of 4 pages (16
tokens), prefill chunks of 16: every chunk of a long prompt ends on a
big-page boundary, where LightLLM's loop takes a big-page state buffer.

* ``prefix-share``: agents on a shared system prompt, per turn one request
  with the agent's history, two tool calls sharing a schema prefix, one
  short greeting every agent sends (shorter than a big page: small-page
  hits, inserts of a prefix another request inserted first) and one prompt
  that shares nothing (a miss);
* ``chunked``: long multi-turn conversations in chunked prefill, each turn
  resuming the previous one's prompt (big-page hits restore state, small-page
  hits copy the tail to fresh slots);
* ``aborts``: per turn, one conversation's request is aborted after its
  first prefill chunk, one after two chunks, one while decoding; the rest
  finish;
* ``pressure``: conversations on a pool too small for them all: LightLLM's
  own scheduling pauses requests mid-prefill and mid-decode, recovers them
  every 100 iterations, and the cache is evicted.

Invariant: a workload drives the loop only through ``submit``, ``abort``
and ``step``, and decides when to abort from the shared-memory record the
router reads (``shm_cur_kv_len``, ``shm_cur_output_len``), as a client
watching its stream would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from kvwatch.targets.driver import workload as shared
from kvwatch.targets.driver.workload import IdleRule, Schedule, TurnStats
from kvwatch.targets.lightllm.infer_build import InferSizes
from kvwatch.targets.lightllm.infer_records import ShmReq
from kvwatch.targets.lightllm.loop import ABORTED, InferLoop

MAX_ITERATIONS = 5_000  # per turn: a loop that never gets idle breaks the run
LINEAR_ARGS = {"linear_att_hash_page_size": 4, "linear_att_page_block_num": 4}


class Workload(shared.Workload):
    """A profile of ``--engine lightllm-cache``: the shared workload with the pools and
    start args it sizes (``sizes``) for a cache, request ids counted from 1, and
    aborts its clients decide by what they watch (``abort_when``)."""

    vocab: ClassVar[int] = 4_000
    idle_rule: ClassVar[IdleRule] = IdleRule(
        max_steps=MAX_ITERATIONS, stuck="LightLLM's loop did not get idle in {n} iterations"
    )

    def __init__(self, *, c: int = 4, seed: int = 0, cache: str = "radix") -> None:
        super().__init__(c=c, seed=seed)
        self.cache = cache
        self.next_rid = 1
        self.watching = Schedule()  # the aborts the clients decide while the loop runs

    def sizes(self) -> InferSizes:
        raise NotImplementedError

    def infer_sizes(self, kv_tokens: int, **args: int) -> InferSizes:
        over = {"chunked_prefill_size": 16, "batch_max_tokens": 64, **args}
        if self.cache == "linear":
            over |= LINEAR_ARGS | {"linear_att_cache_size": 2 * self.c + 4}
        return InferSizes(
            cache=self.cache, kv_tokens=kv_tokens, max_reqs=4 * self.c + 4, max_seq=512, args=over
        )

    def turn(self, loop: InferLoop, t: int) -> TurnStats:
        raise NotImplementedError

    def submit(self, loop: InferLoop, prompt: list[int], max_new: int) -> ShmReq:
        rid, self.next_rid = self.next_rid, self.next_rid + 1
        return loop.submit(rid, prompt, max_new)

    def abort_when(self, loop: InferLoop, record: ShmReq, when: Callable[[ShmReq], bool]) -> None:
        """Abort ``record``'s request once ``when(record)`` holds, checked before every
        iteration, as a client watching its stream would."""
        rid = record.request_id
        self.watching.once(lambda: when(record), lambda: loop.abort(rid))

    def run(self, loop: InferLoop, schedule: Schedule | None = None) -> int:
        """Step until idle, aborting each watched request once its trigger holds (and
        running ``schedule``'s operations, if given)."""
        watching, self.watching = self.watching, Schedule()
        if schedule is not None:
            watching.when += schedule.when
            for k, operations in schedule.at.items():
                watching.at.setdefault(k, []).extend(operations)
        return super().run(loop, watching)

    @staticmethod
    def answer(loop: InferLoop, record: ShmReq) -> list[int]:
        """The prompt and what was generated, unless the request was aborted."""
        if loop.status_of(record.request_id) == ABORTED:
            return []
        return record.get_prompt_ids() + record.outputs()


class PrefixShare(Workload):
    name = "prefix-share"
    summary = "agents on a shared system prompt, tool calls on a shared schema, greetings, misses"

    def sizes(self) -> InferSizes:
        return self.infer_sizes(256 * self.c + 256)

    def start(self, loop: InferLoop) -> None:
        self.system, self.schema, self.greeting = self.tokens(40), self.tokens(20), self.tokens(10)
        self.histories = {f"agent{i}": [] for i in range(self.c)}

    def turn(self, loop: InferLoop, t: int) -> TurnStats:
        mains = {}
        for name, hist in self.histories.items():
            base = self.system + hist + self.tokens(10)
            mains[name] = self.submit(loop, base, 6)
            for _ in range(2):
                self.submit(loop, base + self.schema + self.tokens(5), 3)
            self.submit(loop, self.greeting, 2)
            self.submit(loop, self.tokens(9 + t), 2)  # shares nothing: a miss
        self.run(loop)
        for name, record in mains.items():
            self.histories[name] = self.answer(loop, record)[len(self.system) :][-96:]
        return self.stats()


class Chunked(Workload):
    name = "chunked"
    summary = "long multi-turn conversations in chunked prefill, resumed from the cache"

    def sizes(self) -> InferSizes:
        return self.infer_sizes(320 * self.c + 128)

    def start(self, loop: InferLoop) -> None:
        self.histories = {f"conv{i}": self.tokens(50 + 7 * i) for i in range(self.c)}

    def turn(self, loop: InferLoop, t: int) -> TurnStats:
        records = {
            name: self.submit(loop, hist + self.tokens(13 + t % 3), 8)
            for name, hist in self.histories.items()
        }
        self.run(loop)
        for name, record in records.items():
            self.histories[name] = self.answer(loop, record)[-200:]
        return self.stats()


def _prefilled(chunks: int) -> Callable[[ShmReq], bool]:
    """True once ``chunks`` prefill chunks of 16 ran past the cache hit, prompt unfinished."""

    def due(record: ShmReq) -> bool:
        done = record.shm_cur_kv_len - record.prompt_cache_len
        return done >= 16 * chunks and record.shm_cur_kv_len < record.input_len - 1

    return due


def _decoded(record: ShmReq) -> bool:
    return record.shm_cur_output_len >= 3


class Aborts(Workload):
    name = "aborts"
    summary = "requests aborted after one prefill chunk, after two, and while decoding"

    def sizes(self) -> InferSizes:
        return self.infer_sizes(256 * self.c + 192)

    def start(self, loop: InferLoop) -> None:
        self.histories = {f"conv{i}": self.tokens(24) for i in range(self.c)}

    def _plan(self, loop: InferLoop, t: int, i: int, hist: list[int]) -> ShmReq:
        stage = (i + t) % 4
        if stage in (0, 1):  # a long prompt, aborted mid-prefill after 1 or 2 chunks
            record = self.submit(loop, hist + self.tokens(70), 4)
            self.abort_when(loop, record, _prefilled(stage + 1))
        elif stage == 2:  # aborted while decoding
            record = self.submit(loop, hist + self.tokens(12), 24)
            self.abort_when(loop, record, _decoded)
        else:
            record = self.submit(loop, hist + self.tokens(12), 6)
        return record

    def turn(self, loop: InferLoop, t: int) -> TurnStats:
        records = {
            name: self._plan(loop, t, i, hist)
            for i, (name, hist) in enumerate(self.histories.items())
        }
        self.run(loop)
        for name, record in records.items():
            if answer := self.answer(loop, record):
                self.histories[name] = answer[-64:]
        return self.stats()


class Pressure(Workload):
    name = "pressure"
    summary = "a pool too small for the load: LightLLM pauses, recovers and evicts"

    def sizes(self) -> InferSizes:
        return self.infer_sizes(72 * self.c + 24)

    def start(self, loop: InferLoop) -> None:
        self.histories = {f"conv{i}": self.tokens(20 + 5 * (i % 3)) for i in range(self.c)}

    def turn(self, loop: InferLoop, t: int) -> TurnStats:
        records = {}
        for name, hist in self.histories.items():
            # one decodes long, one prefills a long prompt in chunks: memory runs out
            # mid-prefill and mid-decode, and LightLLM pauses one of them
            records[name] = self.submit(loop, hist + self.tokens(6), 30)
            self.submit(loop, hist + self.tokens(50), 4)
        self.run(loop)
        for name, record in records.items():
            self.histories[name] = self.answer(loop, record)[-30:]
        return self.stats()


WORKLOADS: dict[str, type[Workload]] = {w.name: w for w in (PrefixShare, Chunked, Aborts, Pressure)}
