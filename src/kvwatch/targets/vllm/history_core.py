"""vLLM's scheduler as the history tier's loop: ``Core`` with what the player reads.

``HistoryCore`` is ``loop.Core`` (the scheduler stepped as vLLM's engine core
steps it, the checks after every ``schedule()``) plus the reads of the
``EngineLoop`` contract that a played history needs:

* ``outcomes``: a request ends when vLLM marks it finished. ``FINISHED_STOPPED``
  and ``FINISHED_LENGTH_CAPPED`` are answered (``finished``); an abort its client
  asked for is ``aborted``; any other end (``FINISHED_ERROR``, ``FINISHED_IGNORED``,
  an abort nobody asked for) is the engine's own, counted as unasked;
* ``stage``: ``WAITING`` is ``queued`` (``retracted`` once preempted),
  ``PREEMPTED`` is ``retracted``, ``RUNNING`` is ``prefilling`` until the prompt is
  computed and ``decoding`` after;
* ``input_of`` / ``output_of``: the ``Request``'s prompt and output tokens;
* ``hit_of``: the tokens its first schedule found computed already (the prefix
  cache's hit, ``NewRequestData.num_computed_tokens``), ``admitted`` once it was
  scheduled.

Sessions are vLLM's streaming-input sessions (``history_sessions.py``): a
turn is one input chunk under the session's request id, and its input,
output and end are the chunk's, as ``AsyncLLM``'s caller receives them.
A next turn sent while the one before is live waits behind it and builds
on it (``session_queues_turns``); a finished chunk's last sampled token is
not kept (``session_keeps``).

``submit`` refuses (``Refused``, a client's 400) what vLLM's front end refuses
before the scheduler sees it: an empty prompt, a prompt of ``context`` tokens
or more, prompt plus ``max_tokens`` over ``context``, an id still live.

With two steps in flight a step with nothing to schedule only applies the
oldest output, as ``EngineCore.step_with_batch_queue`` does; ``CoreProbe``
reads the audit ``Core`` latches and takes at barriers as ``ProbeReport``s.
vLLM is imported inside the methods only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvwatch.contracts import ProbeReport
from kvwatch.targets.driver.engine_loop import ABORTED, FINISHED, Outcome, Refused
from kvwatch.targets.driver.history_process import Unsupported
from kvwatch.targets.driver.step_probe import StepProbe
from kvwatch.targets.vllm import kv_groups
from kvwatch.targets.vllm.audit_report import probe_report
from kvwatch.targets.vllm.history_sessions import StreamingSessions
from kvwatch.targets.vllm.kv_layout import from_json
from kvwatch.targets.vllm.loop import Core
from kvwatch.targets.vllm.scheduler_build import build

ANSWERED = ("FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED")


class HistoryCore(Core):
    session_keeps = "finished-less-last"
    session_queues_turns = True

    def __init__(self, scheduler, in_flight: int, context: int) -> None:
        super().__init__(scheduler, in_flight)
        self.context = context
        self.handles: dict[str, Any] = {}  # rid -> its Request, live or ended
        self.hits: dict[str, int] = {}  # rid -> tokens computed before its first schedule
        self.asked: set[str] = set()  # aborts a client asked for
        self.over: set[str] = set()  # requests whose outcome is out
        self.sessions = StreamingSessions(context)

    # -- the operations ------------------------------------------------------------------
    def submit(self, rid: Any, prompt: list[int], max_new: int, **options: Any) -> Any:
        if not prompt:
            raise Refused("The decoder prompt cannot be empty")
        if len(prompt) >= self.context or len(prompt) + max_new > self.context:
            raise Refused(
                f"This model's maximum context length is {self.context} tokens; the request "
                f"has {len(prompt)} prompt tokens and asks for {max_new} more"
            )
        extra = {"priority": options["priority"]} if options.get("priority") is not None else {}
        if sid := options.get("session_id"):
            self.sessions.add(rid, sid, len(prompt), max_new)
            return super().submit(sid, prompt, max_new, resumable=True, **extra)
        if rid in self.scheduler.requests or rid in self.sessions.by_id:
            raise Refused(f"request id {rid} is already running")
        self.handles[rid] = super().submit(rid, prompt, max_new, **extra)
        return self.handles[rid]

    def open_session(self, session_id: str) -> None:
        if session_id in self.handles:
            raise Refused(f"request id {session_id} is already running")
        self.sessions.open(session_id)

    def close_session(self, session_id: str) -> None:
        """The input stream ends: a last, non-resumable request under the session's id
        (it waits behind a chunk still running), as ``AsyncLLM`` sends it."""
        s = self.sessions.by_id.get(session_id)
        if s is None or s.closed:
            raise Refused(f"no open session {session_id}")
        s.closed = True
        if not s.over and session_id in self.scheduler.requests:
            super().submit(session_id, [0], 1, resumable=False)
            self.ended()

    def session_open(self, session_id: str) -> bool:
        return self.sessions.is_open(session_id)

    def abort(self, request_id: str) -> None:
        turn = self.sessions.turns.get(request_id)
        if turn is not None:  # the client cancels its stream: the session ends
            if not turn.done and turn.session in self.scheduler.requests:
                self.outcomes.extend(self.sessions.end(turn.session, ABORTED, self.steps))
                super().abort(turn.session)
            self.notify()
            return
        if request_id in self.scheduler.requests:
            self.asked.add(request_id)
        super().abort(request_id)
        self.notify()

    def step(self) -> None:
        """``EngineCore.step_with_batch_queue``: with nothing to schedule and a step
        in flight, only that step's output is applied."""
        if self.depth > 1 and self.queue and not self.scheduler.has_requests():
            self.steps += 1
            self._apply()
            self.ended()
            self.notify()
            return
        super().step()

    # -- what the steps tell -------------------------------------------------------------
    def scheduled(self, out) -> None:
        for new in out.scheduled_new_reqs:
            s = self.sessions.by_id.get(new.req_id)
            turn = s.current() if s is not None else None
            rid = turn.rid if turn is not None else new.req_id
            self.hits.setdefault(rid, new.num_computed_tokens)
        for sid in out.num_scheduled_tokens:
            s = self.sessions.by_id.get(sid)
            turn = s.current() if s is not None else None
            if turn is not None and turn.input is None:
                turn.input = tuple(self.scheduler.requests[sid].prompt_token_ids)

    def took(self, outputs) -> None:
        for per_client in (outputs or {}).values():
            for o in per_client.outputs:
                if o.request_id in self.sessions.by_id:
                    why = None if o.finish_reason is None else str(o.finish_reason)
                    ended = self.sessions.received(
                        o.request_id, list(o.new_token_ids), why, self.steps
                    )
                    if ended is not None:
                        self.outcomes.append(ended)

    def ended(self) -> None:
        for rid, request in self.handles.items():
            if rid in self.over or not request.is_finished():
                continue
            self.over.add(rid)
            name = request.status.name
            if name in ANSWERED:
                status, why = FINISHED, ""
            elif name == "FINISHED_ABORTED" and rid in self.asked:
                status, why = ABORTED, ""
            else:
                status, why = self.unasked, f"vLLM ended it {name}"
            self.outcomes.append(Outcome(rid=rid, status=status, step=self.steps, why=why))
        for sid, s in self.sessions.by_id.items():  # a session's request gone, turns left
            if not s.over and s.current() is not None and sid not in self.scheduler.requests:
                why = "vLLM ended the session's request"
                self.outcomes.extend(self.sessions.end(sid, self.unasked, self.steps, why))

    # -- reads ---------------------------------------------------------------------------
    def _stage_of(self, request) -> str:
        name = request.status.name
        if name == "WAITING":
            return "retracted" if request.num_preemptions else "queued"
        if name == "PREEMPTED":
            return "retracted"
        if name == "RUNNING":
            done = request.num_computed_tokens >= request.num_prompt_tokens
            return "decoding" if done else "prefilling"
        return name.lower()

    def stage(self, rid: Any) -> str | None:
        turn = self.sessions.turns.get(rid)
        if turn is not None:
            s = self.sessions.by_id[turn.session]
            request = self.scheduler.requests.get(turn.session)
            if turn.done or request is None:
                return None
            return self._stage_of(request) if s.current() is turn else "queued"
        request = self.handles.get(rid)
        if request is None or request.is_finished() or rid not in self.scheduler.requests:
            return None
        return self._stage_of(request)

    def live_rids(self) -> list[Any]:
        """The requests with work left, each session's by its current turn."""
        out = []
        for rid in super().live_rids():
            s = self.sessions.by_id.get(rid)
            turn = s.current() if s is not None else None
            out.append(turn.rid if turn is not None else rid)
        return out

    def input_of(self, rid: Any) -> tuple[int, ...] | None:
        if (turn := self.sessions.turns.get(rid)) is not None:
            return turn.input
        request = self.handles.get(rid)
        return None if request is None else tuple(request.prompt_token_ids)

    def output_of(self, rid: Any) -> tuple[int, ...]:
        if (turn := self.sessions.turns.get(rid)) is not None:
            return tuple(turn.output)
        request = self.handles.get(rid)
        return () if request is None else tuple(request.output_token_ids)

    def hit_of(self, rid: Any) -> int | None:
        return self.hits.get(rid)

    def admitted(self, rid: Any) -> bool:
        if (turn := self.sessions.turns.get(rid)) is not None:
            return turn.input is not None
        return rid in self.hits


class CoreProbe(StepProbe):
    """The audit ``Core`` takes: the steps it latched (a rule not seen since the last
    barrier) and the barrier's own, as ``ProbeReport``s."""

    def __init__(self, core: Core) -> None:
        super().__init__()
        self.core = core

    def latched(self) -> list[ProbeReport]:
        out = [probe_report(a) for a in self.core.latched]
        self.core.latched = []
        return out

    def report(self) -> ProbeReport:
        return probe_report(self.core.probe()["probes"][-1])


def make_loop(setup: dict, model_dir: str) -> tuple[HistoryCore, CoreProbe]:
    """A fresh scheduler of ``setup`` (``histories.VllmSetup.to_json``) as the history
    tier's loop and probe: the factory ``histories/driver_process.py`` calls in vLLM's
    Python (``history_process.Unsupported`` where the release cannot build the setup)."""
    try:
        scheduler = build(
            Path(model_dir),
            block_size=setup["block_size"],
            num_blocks=setup["num_blocks"],
            policy=setup.get("policy", "fcfs"),
            in_flight=setup.get("in_flight", 1),
            layout=from_json(setup.get("layout")),
            budget=setup["budget"],
            context=setup["context"],
            options=setup.get("options"),
        )
    except kv_groups.Unsupported as exc:
        raise Unsupported(str(exc)) from None
    core = HistoryCore(scheduler, setup.get("in_flight", 1), setup["context"])
    return core, CoreProbe(core)
