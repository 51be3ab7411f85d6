"""ModelRunner: a batch of work -> tensors -> forward -> sampled tokens.

A ``Work`` computes tokens [start, start + n) of one request. When that
reaches the end of the request's tokens, the runner samples the next one. A
verify step computes the last token plus ``k`` drafts and keeps the drafts
the model agrees with, plus one token of its own (greedy acceptance)::

    positions   c      c+1   ...   c+k
    inputs      last   d1    ...   dk
    model says  p0     p1    ...   pk        accept d1..da while d_i == p_(i-1)
    new tokens  d1 .. da, p_a                 computed_to = c + 1 + a

The runner never moves a request's working linear state: the scheduler sets
it to the state at the new frontier when it applies the results, so a request
aborted in between keeps a state that matches its computed tokens. K/V
written past the frontier (rejected drafts) is overwritten later; the
scheduler trims the slots.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import NamedTuple

import torch

from kvwatch.engine.cache.protocol import PrefixCache
from kvwatch.engine.model.model import ForwardItem, ForwardResult, HybridModel
from kvwatch.engine.model.paged import PagedKV
from kvwatch.engine.request import Request


class Work(NamedTuple):
    request: Request
    start: int
    n: int  # tokens of request.tokens to compute from ``start``
    drafts: tuple[int, ...] = ()  # a verify step: n == 1 and these follow the last token


class WorkResult(NamedTuple):
    new_tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    computed_to: int
    states: dict[
        int, torch.Tensor
    ]  # linear states after b tokens: page boundaries, verify positions


class ModelRunner:
    def __init__(self, model: HybridModel, cache: PrefixCache) -> None:
        self.model = model
        self.cache = cache

    def run(self, works: Sequence[Work]) -> list[WorkResult]:
        items = [self._item(w) for w in works]
        outs = self.model.forward(items)
        return [self._finish(w, it, out) for w, it, out in zip(works, items, outs, strict=True)]

    def _item(self, w: Work) -> ForwardItem:
        req, h, p = w.request, w.request.holder, self.cache.page_size
        tokens = req.tokens[w.start : w.start + w.n] + list(w.drafts)
        end = w.start + len(tokens)
        if w.drafts:  # every position may become the frontier
            points = frozenset(range(w.start + 1, end + 1))
            logits = tuple(range(w.start, end))
        else:
            points = {b for b in range(w.start + 1, end + 1) if b % p == 0} | {end}
            points = frozenset(points | {b for b, _ in self.cache.capture_points(h, w.start, end)})
            logits = (end - 1,) if end == len(req.tokens) else ()
        table = self.cache.page_table(h)
        kv = PagedKV(self.cache.pools, table.full, table.swa, table.linear)
        return ForwardItem(
            tokens=tokens, start=w.start, kv=kv, state_points=points, logit_positions=logits
        )

    def _finish(self, w: Work, it: ForwardItem, out: ForwardResult) -> WorkResult:
        req = w.request
        logprobs = out.logits.log_softmax(-1) if len(out.logits) else out.logits
        if w.drafts:
            predicted = out.logits.argmax(-1).tolist()
            a = 0
            while a < len(w.drafts) and w.drafts[a] == predicted[a]:
                a += 1
            new = (*w.drafts[:a], predicted[a])
            picks = list(range(a + 1))
            computed_to = w.start + 1 + a
        elif len(out.logits):
            new = (self._sample(req, out.logits[-1]),)
            picks = [len(out.logits) - 1]
            computed_to = w.start + w.n
        else:
            new, picks, computed_to = (), [], w.start + w.n
        it.kv.write_experts(w.start, out.experts[: computed_to - w.start])
        lps = tuple(float(logprobs[i, t]) for i, t in zip(picks, new, strict=True))
        states = {b: s for b, s in out.states.items() if b <= computed_to}
        return WorkResult(new_tokens=new, logprobs=lps, computed_to=computed_to, states=states)

    @staticmethod
    def _sample(req: Request, logits: torch.Tensor) -> int:
        params = req.params
        if params.greedy:
            return int(logits.argmax())
        # Shifted so the largest is 0: a tiny temperature cannot overflow to inf (NaN probs).
        probs = ((logits - logits.max()) / params.temperature).softmax(-1)
        if params.top_p < 1:
            sorted_p, order = probs.sort(descending=True)
            keep = sorted_p.cumsum(-1) - sorted_p < params.top_p
            probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
        if req.generator is None:
            seed = params.seed if params.seed is not None else zlib.crc32(req.id.encode())
            req.generator = torch.Generator(device="cpu").manual_seed(seed)
        return int(torch.multinomial(probs.cpu(), 1, generator=req.generator))
