"""What would catch each mutant the gate let through, by mutant id, and why no
program reaches an unreached line, by ``file:function``.

Written by hand after reading the runs: the parts of
``docs/mutation-score.md`` that are not generated.
"""

from __future__ import annotations

NOTES: dict[str, str] = {
    "engine/cache/radix_backend.py:7": (
        "A recovery that must load a host-tier snapshot, where the load fails (the tier.load "
        "failpoint, or a full device pool) and no shallower snapshot on the path is usable: "
        "the root keeps one ref too many (seed 002's leak, on the load path). It survived the "
        "scored run: the gate's runs failed tier.load, but never for a request with nothing "
        "usable above its snapshot. Since then the edges profile pushes out a cold prompt "
        "each turn whose load fails (the fail_load test control), and `kvwatch gate --quick "
        "--profile edges` fails this mutant (refcount at turn 0, quiescence after the drain; "
        "checked by hand, the clean run passing); tests/engine/cache/test_cold_recovery.py holds the "
        "path. The score above is the scored run's."
    ),
    "engine/scheduler.py:10": (
        "When a placement in the middle of a step retracts a victim that was already given "
        "work in that step, the victim's work stays in the batch and the model runner meets "
        "a request that holds no pages (a 500 on that request). The gate's profiles never "
        "place a newer request before an older one runs out of pages in the same step; a "
        "profile whose pools are sized so that a new admission and the decode growth of the "
        "running requests exhaust them together at c >= 4 would, and the in-process fuzz "
        "(radix-pressure) does."
    ),
    "engine/scheduler.py:17": (
        "A request that fails in the engine does not end its session's turn, so the "
        "session's next turn is refused as 'already has a turn in flight'. No gate profile "
        "makes a session request fail in the engine (a prompt larger than the pool can "
        "ever hold) and then goes on with that session; a chaos step that does would turn "
        "the refusal into a failed request for the requests detector."
    ),
}


UNREACHED: dict[str, str] = {
    "engine/cache/radix.py:RadixTree.evict_all": (
        "The branch that puts the root in the evict set once the tree empties: it is the "
        "root-in-evict-set fault's (seed 002), taken only with that fault planted, and the "
        "programs run the clean engine. The copy makes the fault's add a no-op, so on the "
        "clean engine the mutant is the clean engine; the fault's own tests "
        "(tests/engine/cache/test_faults.py) and the fault matrix run the line."
    ),
    "server/worker.py:EngineWorker._fail_loads": (
        "The fail_load test control (a request pushed out to the host tier whose snapshot "
        "load is failed on purpose) forgets its script once the request is gone or came back "
        "without a load to fail. The server programs (mutation/serverfuzz.py) send no "
        "fail_load control; the gate's edges profile does (its cold prompt, every turn), and "
        "tests/server/test_server_controls.py drives the control directly."
    ),
    "server/worker.py:EngineWorker._stop_engine": (
        "Runs only when an engine step raises outside the engine's per-request failure "
        "paths, which only an engine bug makes: no load on a correct engine runs it. "
        "tests/server/test_server_engine_stop.py plants a step that raises and checks that "
        "the streams in flight end with an error, new requests get a 503 and /health says so."
    ),
    "engine/scheduler.py:Scheduler._forced_retract": (
        "Runs only with SchedulerConfig.retract_every set, the forced retraction the gate's "
        "agentic-trie and streaming-session profiles turn on (every 6th and 5th step); the "
        "line-reach programs leave it off and retract by pool pressure alone."
    ),
    "engine/scheduler.py:Scheduler._fail_hard": (
        "The branch for a holder that raises while it is given back after a failure: only "
        "a cache whose state is already broken raises there, and the programs run the "
        "clean engine. The audit then reports what the holder still holds."
    ),
    "server/worker.py:EngineWorker._after_step": (
        "A test-control script (retract_after, pause_after_output) whose request ended "
        "before the script came due. The gate's profiles script requests that live long "
        "enough; the server programs script none that end first."
    ),
    "engine/cache/slots.py:SlotTable.findings": (
        "The text of a slot-table finding: the line runs only when an entry disagrees with "
        "its slot, which only a broken table (the stale-slot-entry fault) makes, and the "
        "programs run the clean engine. The slice shortens a key in the message; the "
        "finding, and the verdict, stay."
    ),
    "server/idle.py:close_if_idle": (
        "The idle reaper runs only in a server started with --session-idle-timeout, and the "
        "server programs (mutation/serverfuzz.py) start theirs without one. The gate's chaos "
        "and edges profiles serve with a timeout (5 s and 4 s) and reap sessions; the "
        "branch for a session closed some other way between the reaper's listing and its "
        "close needs a client's close to land in that window."
    ),
    "engine/engine.py:Engine._run": (
        "The branch for a model runner that raises. The runner raises only on an engine "
        "bug (a piece with no pages, an index out of range): no load on a correct engine "
        "runs it, so no program can. tests/engine/test_runner_failure.py plants a runner that "
        "raises on one request and checks that it fails alone; the skip-cleanup mutant is "
        "equivalent there too, since the piece-by-piece loop below it reruns a lone piece "
        "and fails it the same way."
    ),
    "engine/cache/commit.py:Commits.release_for_sharers": (
        "Runs when a holder leaves a path on which exactly one other running holder "
        "still locks a node that keeps a snapshot: that snapshot is now the other's alone "
        "and, if superseded, goes at once. The line-reach programs (mutation/fuzz.py) end "
        "sharers together or never branch below a snapshot while another conversation runs "
        "there; a program in which two conversations branch below a kept snapshot and the "
        "first ends while the second still decodes would reach it. (An aborted retracted "
        "request now leaves its anchor this way too, "
        "tests/engine/cache/test_retracted_release.py.)"
    ),
}
