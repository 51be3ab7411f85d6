"""Scheduler fuzz: random arrivals, aborts, pauses, retractions and pool pressure,
with the radix cache or the snapshot-slot backend.

After every operation the probe has no findings. At the end the engine
drains, every request ends in a known state (a failure carries its error),
and once the cache is flushed every pool is back to empty.
"""

from __future__ import annotations

import pytest
from conversations import small_cache
from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvwatch.engine import Engine, EngineConfig, SamplingParams, SchedulerConfig, SpecConfig
from kvwatch.engine.model.tokenizer import USER
from kvwatch.engine.request import Status

# A small alphabet, so prompts share pages, with turn markers for the slots backend.
PROMPT_TOKENS = st.sampled_from([*range(32, 41), USER])


class EngineMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.engine: Engine | None = None
        self.prompts: list[list[int]] = [[]]

    @precondition(lambda self: self.engine is None)
    @rule(
        chunk=st.integers(1, 40),
        max_running=st.integers(1, 8),
        spec=st.booleans(),
        full=st.sampled_from([24, 64, 256]),
        mode=st.sampled_from(["radix", "slots"]),
    )
    def start(self, chunk, max_running, spec, full, mode):
        config = EngineConfig(
            cache=small_cache(full=full, swa=48, state=14, host=6, mode=mode, slot_min_tokens=8),
            scheduler=SchedulerConfig(
                max_running=max_running,
                chunk_size=chunk,
                max_batch_tokens=max(chunk, 6) * 3,
                spec=SpecConfig(num_drafts=3) if spec else None,
            ),
        )
        self.engine = Engine(config)

    def _live(self, *statuses: Status) -> list[str]:
        return sorted(self.engine.request_ids(*statuses))

    # -- rules ---------------------------------------------------------------------------
    @precondition(lambda self: self.engine is not None)
    @rule(data=st.data(), max_tokens=st.integers(1, 10), sampled=st.booleans())
    def add(self, data, max_tokens, sampled):
        base = data.draw(st.sampled_from(self.prompts[-5:]))
        cut = data.draw(st.integers(0, len(base)))
        prompt = base[:cut] + data.draw(st.lists(PROMPT_TOKENS, min_size=1, max_size=60))
        self.prompts.append(prompt)
        params = SamplingParams(max_tokens=max_tokens, temperature=0.8 if sampled else 0.0, seed=1)
        self.engine.add_request(prompt, params)

    @precondition(lambda self: self.engine is not None and len(self.engine.open_sessions()) < 4)
    @rule(record=st.booleans())
    def open_session(self, record):
        self.engine.open_session(record=record, routed_experts=record)

    def _idle_sessions(self) -> list[str]:
        return sorted(sid for sid, s in self.engine.open_sessions().items() if s.in_flight is None)

    @precondition(lambda self: self.engine is not None)
    @rule(data=st.data(), max_tokens=st.integers(1, 8))
    def session_turn(self, data, max_tokens):
        idle = self._idle_sessions()
        if idle:
            sid = data.draw(st.sampled_from(idle))
            tokens = self.engine.session_tokens(sid)
            more = data.draw(st.lists(PROMPT_TOKENS, min_size=1, max_size=30))
            self.engine.add_request(
                [*tokens, *more], SamplingParams(max_tokens=max_tokens), session_id=sid
            )

    @precondition(lambda self: self.engine is not None)
    @rule(data=st.data(), close=st.sampled_from([False, False, True]))
    def close_or_roll_back(self, data, close):
        idle = self._idle_sessions()
        if idle:
            sid = data.draw(st.sampled_from(idle))
            if close:
                self.engine.close_session(sid)
            elif self.engine.session_info(sid).turns >= 1:
                self.engine.rollback_session(sid, 1)

    @precondition(lambda self: self.engine is not None)
    @rule(n=st.integers(1, 4))
    def step(self, n):
        for _ in range(n):
            self.engine.step()

    @precondition(lambda self: self.engine is not None)
    @rule(data=st.data())
    def abort(self, data):
        live = self._live(Status.WAITING, Status.RUNNING, Status.RETRACTED, Status.PAUSED)
        if live:
            assert self.engine.abort(data.draw(st.sampled_from(live)))

    @precondition(lambda self: self.engine is not None)
    @rule(data=st.data())
    def pause_or_resume(self, data):
        live = self._live(Status.WAITING, Status.RUNNING, Status.RETRACTED, Status.PAUSED)
        if live:
            rid = data.draw(st.sampled_from(live))
            if self.engine.request_info(rid).status is Status.PAUSED:
                self.engine.resume(rid)
            else:
                self.engine.pause(rid)

    @precondition(lambda self: self.engine is not None)
    @rule(data=st.data())
    def retract(self, data):
        running = self._live(Status.RUNNING)
        if len(running) > 1:
            self.engine.retract(data.draw(st.sampled_from(running)))

    # -- checks --------------------------------------------------------------------------
    @invariant()
    def probe_is_clean(self):
        if self.engine is not None:
            report = self.engine.probe()
            assert report.clean, "\n".join(map(str, report.findings))
            assert report.root_refs.actual == report.root_refs.expected

    def teardown(self):
        if self.engine is None:
            return
        engine = self.engine
        for rid in self._live(Status.PAUSED):
            engine.resume(rid)
        for _ in range(5000):
            if not engine.has_unfinished():
                break
            engine.step()
        assert not engine.has_unfinished(), "the engine did not drain"
        for rid in engine.request_ids():
            done = engine.take(rid)
            assert done.finish_reason in ("stop", "length", "abort", "error")
            assert (done.finish_reason == "error") == (done.error is not None)
        for sid in engine.open_sessions():
            engine.close_session(sid)
        engine.flush_cache()
        report = engine.probe()
        assert report.clean, report.findings
        for name, group in report.groups.items():
            assert group.free == group.capacity, f"{name} did not return to empty: {group}"


def machine(seed_value: int) -> type[EngineMachine]:
    @seed(seed_value)
    class Machine(EngineMachine):
        pass

    return Machine


# the fast tier runs one seed; `make test` runs both
@pytest.mark.parametrize("seed_value", [11, pytest.param(12, marks=pytest.mark.slow)])
def test_scheduler_fuzz(seed_value):
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(
        machine(seed_value),
        settings=settings(
            max_examples=30,
            stateful_step_count=60,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
