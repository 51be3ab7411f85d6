"""``Core``: vLLM's scheduler stepped as its engine core steps it, with no model, as an
``EngineLoop`` (``kvwatch.targets.driver.engine_loop``).

The contract's operations are the engine core's: ``submit`` (a ``Request``
built as the engine core builds one, with vLLM's own block hasher, handed to
``add_request``), ``abort`` (``finish_requests(..., FINISHED_ABORTED)``),
``step`` and ``flush`` (``reset_prefix_cache``: False while blocks are held).
``idle`` is nothing with work left and no output in flight (a session waiting
for its next chunk has none). The recording is vLLM's own, in its driver
process (``run_driver.py``: the barrier probes as ``GET /audit`` answers
them), and so is ``run``: the engine core applies the outputs still in flight
once the work is done, and the clients give up on every stall (``unstick``),
not once.

Each step is ``schedule()``, the checks, then the output a model runner would
give (``model_runner.py``) handed to ``update_from_output``; with two steps in
flight the output of the step before is applied after this one is scheduled,
as the engine core does. The checks run right after each ``schedule()``,
where the engine would run the model: hashes against tokens, the hash ledger,
liveness and scratch over the pool (``checks.py``), and the KV events of each
output applied (``event_tap.py``). A step whose findings show a rule not seen
before since the last barrier is kept as a probe (at most ``LATCH``); a run of
``STALL`` steps that schedule nothing is a finding, and ``MAX_STEPS`` steps
without getting idle breaks the run. vLLM is imported inside the methods only.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from kvwatch.targets.driver.engine_loop import EngineLoop
from kvwatch.targets.vllm.core_probe import answer
from kvwatch.targets.vllm.event_tap import EventTap
from kvwatch.targets.vllm.hash_checks import check_hashes
from kvwatch.targets.vllm.hash_ledger import HashLedger
from kvwatch.targets.vllm.kv_groups import accepted
from kvwatch.targets.vllm.liveness import LivenessTracker, holds_blocks, reset_refused, stalled
from kvwatch.targets.vllm.model_runner import model_output
from kvwatch.targets.vllm.sched_coverage import Coverage
from kvwatch.targets.vllm.scheduler_build import request_hasher
from kvwatch.targets.vllm.scheduler_reads import hash_block_size
from kvwatch.targets.vllm.scratch import check_scratch

LATCH = 8  # probes kept from the steps of one turn
MAX_STEPS = 20_000  # a turn that needs more never ends: the run broke
STALL = 64  # steps in a row that schedule nothing, no work in flight: nothing will move


class Core(EngineLoop):
    """vLLM's scheduler stepped as its engine core steps it, with the checks after
    each ``schedule()`` and the probes the gate reads."""

    engine = "vLLM"

    def __init__(self, scheduler, in_flight: int = 1, token_salt: int = 0) -> None:
        super().__init__()
        self.scheduler, self.depth, self.queue = scheduler, in_flight, deque()
        self.token_salt, self.sampled = token_salt, 0  # the model runner's tokens
        self.hasher = request_hasher(hash_block_size(scheduler) or scheduler.block_size)
        self.liveness, self.ledger = LivenessTracker(), HashLedger()
        self.events, self.coverage = EventTap.install(scheduler), Coverage()
        self.steps, self.sent, self.aborted = 0, 0, 0
        self.quiet = 0  # steps in a row that scheduled nothing with no work in flight
        self.latched: list[dict] = []
        self.seen: set[str] = set()
        self.applied: list = []  # the event findings of the outputs applied since the last look

    def request(self, request_id: str, tokens: list[int], *, max_tokens: int, **extra):
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
        wanted = {
            "request_id": request_id,
            "prompt_token_ids": list(tokens),
            "sampling_params": params,
            "pooling_params": None,
            "arrival_time": float(self.sent + 1),
            "block_hasher": self.hasher,
            "eos_token_id": None,
            "priority": extra.get("priority", 0),
            "resumable": extra.get("resumable", False),
            "cache_salt": extra.get("cache_salt"),
        }
        return Request(**accepted(Request, **wanted))

    def add(self, request) -> None:
        self.sent += 1
        self.scheduler.add_request(request)

    def submit(self, rid: Any, prompt: list[int], max_new: int, **extra: Any) -> Any:
        """A client's request (``extra``: ``priority``, ``resumable``, ``cache_salt``),
        built and added as the engine core does; the ``Request``."""
        request = self.request(rid, prompt, max_tokens=max_new, **extra)
        self.add(request)
        return request

    def abort(self, request_id: str) -> None:
        """The client went away: the engine core's ``abort_requests``."""
        from vllm.v1.request import RequestStatus

        if request_id in self.scheduler.requests:
            self.aborted += 1
            self.scheduler.finish_requests([request_id], RequestStatus.FINISHED_ABORTED)
            self.ended()

    def step(self) -> None:
        """``schedule()``, the checks, a model runner's output; with two steps in
        flight the output of the step before is applied after this one is scheduled."""
        s = self.scheduler
        self.liveness.before(s)
        out = s.schedule()
        self.steps += 1
        self.scheduled(out)
        self.coverage.step(s, out)
        found = check_hashes(s) + self.ledger.observe(s) + self.liveness.after(s, out)
        found += [f for f in check_scratch(s) if s.requests]  # idle: the barrier's to judge
        found += self.applied + self._stall(out)
        self.applied = []
        if {f.rule for f in found} - self.seen and len(self.latched) < LATCH:
            self.seen |= {f.rule for f in found}
            self.latched.append(answer(s, self.steps, found))
        output = model_output(s, out, self.token_salt)
        self.sampled += sum(map(len, output.sampled_token_ids))
        self.queue.append((out, output))
        if len(self.queue) >= self.depth:
            self._apply()
        self.ended()
        self.notify()

    def scheduled(self, out) -> None:
        """(For a subclass.) Right after ``schedule()``: what it scheduled."""

    def took(self, outputs) -> None:
        """(For a subclass.) What ``update_from_output`` returned: the engine core's
        outputs per client, what the callers receive."""

    def ended(self) -> None:
        """(For a subclass.) Before the observers hear of a step or an abort: the
        requests that ended in it."""

    def _apply(self) -> None:
        """The oldest step's output; the events it published checked against the pool."""
        self.took(self.scheduler.update_from_output(*self.queue.popleft()))
        if self.events is not None:
            self.applied += self.events.check(self.scheduler)

    def busy(self) -> bool:
        """Whether a request has work left (a session waiting for input has none)."""
        return any(_has_work(r) for r in self.scheduler.requests.values())

    def idle(self) -> bool:
        """No request with work left and no step's output in flight."""
        return not self.busy() and not self.queue

    def live_rids(self) -> list[Any]:
        """The requests with work left, which their clients abort when they give up."""
        return sorted(r for r, req in self.scheduler.requests.items() if _has_work(req))

    def stalled(self) -> bool:
        """``STALL`` steps in a row scheduled nothing with no work in flight."""
        return self.quiet >= STALL

    def flush(self) -> bool:
        """``reset_prefix_cache()``: every cached block no request holds dropped; False
        (nothing dropped) while blocks are held."""
        return bool(self.scheduler.reset_prefix_cache())

    def reset(self) -> bool:
        """A weight update's cache reset under load (``reset_prefix_cache`` with
        ``reset_running_requests``, as ``pause_generation(clear_cache=True)`` calls it):
        whether it cleared the index; a refusal is a finding of the next probe."""
        try:
            done = bool(self.scheduler.reset_prefix_cache(reset_running_requests=True))
            why = "it returned False"
        except RuntimeError as exc:
            done, why = False, str(exc)
        if not done:
            self.applied.append(reset_refused(self.scheduler, why))
        return done

    def _stall(self, out) -> list:
        """``scheduler-stalled`` once ``STALL`` steps in a row scheduled nothing with
        no work in flight while requests have work left, and no session paused for its
        client's next chunk holds blocks: the stuck requests wait on nothing a client can
        still release (a hold-and-wait). Waiting behind a paused session's blocks is how
        vLLM keeps sessions; it is counted (``stalls behind paused sessions``), not found."""
        scheduled = _scheduled(out) or any(_scheduled(o) for o, _ in self.queue)
        self.quiet = 0 if scheduled else self.quiet + 1
        if self.quiet != STALL:
            return []
        requests = self.scheduler.requests
        if any(
            "STREAMING" in r.status.name and holds_blocks(self.scheduler, rid)
            for rid, r in requests.items()
        ):
            self.coverage.counts["stalls behind paused sessions"] += 1
            return []
        work = sorted(rid for rid, r in requests.items() if _has_work(r))
        return [stalled(self.scheduler, STALL, work)]

    def unstick(self) -> None:
        """After a stall: the clients of the requests that have work left give up
        (aborts; paused sessions stay), so the run goes on."""
        for rid in self.live_rids():
            self.abort(rid)
        self.quiet = 0

    def run(self) -> None:
        """Step until nothing has work left and nothing is in flight (or it stalled)."""
        for _ in range(MAX_STEPS):
            if self.stalled():
                self.unstick()
            if not self.busy():
                break
            self.step()
        else:
            left = sorted(r for r in self.scheduler.requests)[:8]
            raise TimeoutError(f"requests still had work after {MAX_STEPS} steps: {left}")
        while self.queue:
            self._apply()
        self.ended()

    def probe(self) -> dict:
        """The barrier probe: audit, checks (hashes, ledger, scratch) and the steps' latches."""
        s = self.scheduler
        found = check_hashes(s) + self.ledger.observe(s) + check_scratch(s) + self.applied
        if self.events is not None:
            self.events.drain(s)
            found += self.events.check(s)
        probes = [*self.latched, answer(s, self.steps, found)]
        self.latched, self.seen, self.applied = [], set(), []
        return {"probes": probes, "live": len(s.requests)}

    def covered(self) -> dict:
        """What the run exercised (``sched_coverage.py``), with the event totals."""
        c = self.coverage.as_dict(self.events.ledger.totals() if self.events else None)
        return {**c, "requests": self.sent, "aborts": self.aborted}


def _scheduled(out) -> int:
    """Tokens a step scheduled (an empty step still goes in flight with two in flight)."""
    return getattr(out, "total_num_scheduled_tokens", 0) or len(out.num_scheduled_tokens)


def _has_work(request) -> bool:
    return not any(w in str(request.status.name) for w in ("STREAMING", "FINISHED"))
