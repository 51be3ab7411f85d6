"""Suspected SGLang bug (every release with streaming sessions, 0.5.10 to 0.5.23): two turns
of one new streaming session that reach the scheduler in the same iteration.

    .venv/bin/python docs/real-bugs/sglang_same_iteration_session_turns.py [VERSION]...
    (default 0.5.23; any release from 0.5.10 on, e.g. 0.5.10 0.5.17 0.5.21 0.5.23)

Found by ``kvwatch histories --engine sglang`` from generated client histories alone; this
is its shrunk history. SGLang's own ``Scheduler`` from the release's wheel, built by its
own ``__init__`` and stepped one iteration of its event loop at a time
(``loop_choice.make``), with streaming sessions and SGLang's own ``SGLANG_TEST_RETRACT``
(the ``sessions-retract`` setup), is sent only what a tokenizer manager sends: a
streaming session opened; then, in one ``recv_requests`` batch, its first turn t0 (32
tokens) and a second turn t1 (7 tokens), as a client that sends two messages at once
does; and once t1 is answered, the next turn t2 (128 tokens). What each release does:

* 0.5.22, 0.5.23: the scheduler raises ``AssertionError: session_id='s' already has a
  slot`` in ``StreamingSession.take`` (``session/streaming_session.py``) before anything
  is answered. t1 is refused (``Session.create_req``: "Streaming session already has an
  active request.", and ``Req.set_finish_with_abort`` makes it a one-token prefill) but
  keeps its ``req.session`` and is given a row in the same prefill batch as t0: t0's
  allocation makes the session's slot, t1's then asserts. An exception in the event
  loop ends the scheduler process: the server is down.
* 0.5.11 to 0.5.21: t1 is refused, and the refusal clears the session's in-flight flag
  while t0 still runs, so t2, sent once t1 was answered, is taken while t0 runs (and
  computed over its own 128 tokens alone). On 0.5.20 and 0.5.21 the scheduler then
  raises ``AssertionError`` in ``SessionSlot.save_from_req`` (``assert kv is
  self.kv``); on 0.5.11 to 0.5.17 a tree node keeps a lock ref no one holds (kvwatch's
  probe: ``tree node 2 lock ref 1, live holders imply 0``) and, once the session is
  closed and the cache flushed, a KV unit is held by no request, session slot or tree
  node.
* 0.5.10: t1 is not refused: it is computed over t0's 32 tokens and its own 7, and t2
  over both turns.

Prints what each release does; exits 1 when any release shows the bug.
"""

from __future__ import annotations

import logging
import sys

from kvwatch.targets.sglang import loop_choice
from kvwatch.targets.sglang.histories import SETUPS
from kvwatch.targets.sglang.probe import CacheProbe
from kvwatch.targets.sglang.recording import STRICT_INVARIANTS, environment

T0, T1, T2 = list(range(100, 132)), list(range(200, 207)), list(range(300, 428))
CONFIG = SETUPS["sessions-retract"]  # streaming sessions, SGLANG_TEST_RETRACT every 3 decodes
MAX_STEPS = 200


def run_until_idle(driver) -> None:
    for _ in range(MAX_STEPS):
        if driver.idle():
            return
        driver.step()


def replay(release) -> bool:
    """The three turns on a fresh scheduler; whether the bug showed."""
    driver = loop_choice.make(release, CONFIG)
    probe = CacheProbe(driver)
    try:
        driver.open_session("s")
        driver.step()
        t0 = driver.submit("t0", T0, 2, session_id="s")
        t1 = driver.submit("t1", T1, 4, session_id="s")  # the same iteration as t0
        while not any(o.rid == "t1" for o in driver.outcomes) and driver.step_no < MAX_STEPS:
            driver.step()
        ended = {o.rid: (o.status, o.why) for o in driver.outcomes}
        print(f"  step {driver.step_no}: t1 {ended.get('t1')}; t0 {ended.get('t0', 'runs')}")
        t2 = driver.submit("t2", T2, 2, session_id="s")  # its client had t1's answer
        run_until_idle(driver)
        ended = {o.rid: (o.status, o.why) for o in driver.outcomes}
        print(f"  t0 {ended.get('t0')}, t2 {ended.get('t2')}")
        inputs = {name: len(h.origin_input_ids) for name, h in (("t0", t0), ("t1", t1), ("t2", t2))}
        print(f"  inputs as computed: {inputs} (sent: t0 32, t1 7, t2 128 new tokens)")
        findings = probe.report().findings
        driver.close_session("s")
        run_until_idle(driver)
        driver.flush()
        findings = [*findings, *probe.report().findings]
    except AssertionError as exc:
        where = exc.__traceback__
        while where.tb_next is not None:
            where = where.tb_next
        frame = where.tb_frame.f_code
        print(
            f"  the scheduler raised AssertionError: {exc} ({frame.co_filename.split('/srt/')[-1]}:"
            f"{where.tb_lineno} in {frame.co_name}): its event loop, and the server, end here"
        )
        return True
    finally:
        driver.close()
    for f in findings[:3]:
        print(f"  probe: {f.detail[:160]}")
    joined = inputs["t1"] != 1 and inputs["t1"] > len(T1)  # not refused, built on t0
    return bool(findings) or joined


def main() -> int:
    logging.disable(logging.ERROR)  # the refusal's own log line and SGLang's chatter
    versions = sys.argv[1:] or ["0.5.23"]
    shown = []
    for version in versions:
        release = loop_choice.load(version)
        values = {**STRICT_INVARIANTS, **loop_choice.environment(release, CONFIG)}
        print(f"sglang {version}: two turns of a new streaming session in one iteration:")
        with release.active(), environment(values):
            shown.append(replay(release))
    return 1 if any(shown) else 0


if __name__ == "__main__":
    raise SystemExit(main())
