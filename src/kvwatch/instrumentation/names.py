"""Every metric, span and attribute name kvwatch emits, in one place, and each
metric's help text (``HELP``, the ``# HELP`` line of its Prometheus series).

Dashboards and detectors import these; nothing else spells a name. GenAI
names follow the OpenTelemetry GenAI semantic conventions where one exists.
"""

from __future__ import annotations

METER = "kvwatch"
TRACER = "kvwatch"

# -- pool and cache gauges ------------------------------------------------------------------
POOL_PAGES = "kvwatch.pool.pages"  # {group, family, state}
POOL_CAPACITY = "kvwatch.pool.capacity"  # {group, family}
POOL_STATES = (
    "free",
    "used",
    "evictable",
    "pinned_request",
    "pinned_session",
    "host",
    "host_evictable",
)
ROOT_REFS = "kvwatch.tree.root_refs"
ROOT_REFS_EXPECTED = "kvwatch.tree.root_refs_expected"
TREE_NODES = "kvwatch.tree.nodes"
TREE_SNAPSHOTS = "kvwatch.tree.snapshots"  # {group}
# snapshots on nodes that have children: superseded continuation states (seed 000)
TREE_INTERIOR_SNAPSHOTS = "kvwatch.tree.interior_snapshots"  # {group}
SESSION_PAGES = "kvwatch.session.pages"  # {group}
SESSIONS_LIVE = "kvwatch.sessions.live"
RECORD_BYTES = "kvwatch.records.bytes"
REQUESTS_LIVE = "kvwatch.requests.live"  # {state}
SLOTS_FILLED = "kvwatch.slots.filled"
SLOT_ENTRIES = "kvwatch.slots.entries"

# -- counters -------------------------------------------------------------------------------
PREFIX_QUERIED = "kvwatch.prefix_cache.queried_tokens"
PREFIX_HIT = "kvwatch.prefix_cache.hit_tokens"
RETRACTIONS = "kvwatch.retractions"
ABORTS = "kvwatch.aborts"  # {stage}
ABORT_STAGES = ("queued", "prefill", "decode", "verify", "retracted", "paused")
EVICTIONS = "kvwatch.evictions"  # {kind}
EVICTION_KINDS = ("node", "snapshot", "slot")
REQUESTS_FINISHED = "kvwatch.requests.finished"  # {reason}
TOKENS_GENERATED = "kvwatch.tokens.generated"  # output tokens, speculative ones once accepted
PREFILL_COMPUTED = "kvwatch.prefill.computed_tokens"  # prompt tokens run through the model

# -- GenAI latency histograms (seconds) ------------------------------------------------------
TTFT = "gen_ai.server.time_to_first_token"
TPOT = "gen_ai.server.time_per_output_token"
REQUEST_DURATION = "gen_ai.server.request.duration"

# -- the gate's verdict (a batch job: pushed or written as a text file, not scraped) --------
GATE_JOB = "kvwatch-gate"
GATE_VERDICT = "kvwatch.gate.verdict"  # {verdict}: 1 on the gate's verdict, 0 on the others
GATE_DETECTOR_FAILED = "kvwatch.gate.detector.failed"  # {profile, concurrency, detector}
GATE_FIRST_FAIL_TURN = "kvwatch.gate.detector.first_fail_turn"  # {profile, concurrency, detector}
GATE_RUN_REQUESTS = "kvwatch.gate.run.requests"  # {profile, concurrency}
GATE_RUN_ERRORS = "kvwatch.gate.run.errors"  # {profile, concurrency}: failed requests
GATE_RUN_BROKEN = "kvwatch.gate.run.broken"  # {profile, concurrency}: 1 when the run broke
GATE_HEAP_PER_TOKEN = "kvwatch.gate.heap_bytes_per_held_token"  # {profile, concurrency, turn}
GATE_VERDICTS = ("pass", "fail", "error")

# -- attributes -----------------------------------------------------------------------------
GROUP = "group"
FAMILY = "family"
STATE = "state"
OPERATION = "gen_ai.operation.name"
MODEL = "gen_ai.request.model"
CONVERSATION = "gen_ai.conversation.id"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
FINISH_REASONS = "gen_ai.response.finish_reasons"
RESPONSE_ID = "gen_ai.response.id"
PROMPT_TEXT = "gen_ai.prompt"  # only with content capture switched on
HIT_TOKENS = "kvwatch.cache.hit_tokens"
ERROR_TYPE = "error.type"
PROFILE = "profile"
CONCURRENCY = "concurrency"
DETECTOR = "detector"
TURN = "turn"
VERDICT = "verdict"
REASON = "reason"
STAGE = "stage"
KIND = "kind"

# -- spans and span events ------------------------------------------------------------------
SPAN_QUEUE = "queue"
SPAN_PREFILL = "prefill_chunk"
SPAN_DECODE = "decode"
EVENT_RETRACTED = "kvwatch.retracted"
EVENT_RECOVERED = "kvwatch.recovered"
EVENT_PAUSED = "kvwatch.paused"
EVENT_SPEC = "kvwatch.spec_verify"
EVENT_SLOT = "kvwatch.slot"  # attributes: action, slot, ...
EVENT_SNAPSHOT_SKIPPED = "kvwatch.snapshot_skipped"


# every instrument the engine's metrics create (the slot gauges only with the slots backend)
ENGINE_GAUGES = (
    POOL_PAGES,
    POOL_CAPACITY,
    ROOT_REFS,
    ROOT_REFS_EXPECTED,
    TREE_NODES,
    TREE_SNAPSHOTS,
    TREE_INTERIOR_SNAPSHOTS,
    SESSION_PAGES,
    SESSIONS_LIVE,
    RECORD_BYTES,
    REQUESTS_LIVE,
    SLOTS_FILLED,
    SLOT_ENTRIES,
)

# -- Prometheus series names ---------------------------------------------------------------
COUNTERS = (
    PREFIX_QUERIED,
    PREFIX_HIT,
    RETRACTIONS,
    ABORTS,
    EVICTIONS,
    REQUESTS_FINISHED,
    TOKENS_GENERATED,
    PREFILL_COMPUTED,
)
SECONDS = (TTFT, TPOT, REQUEST_DURATION)


def prom(name: str) -> str:
    """The series name the OTel Prometheus exporter gives instrument ``name``.

    Dots become underscores, histograms in seconds gain ``_seconds`` and
    counters ``_total``; annotation units such as ``{page}`` add nothing. A
    test scrapes a live engine to keep this in step with the exporter.
    """
    base = name.replace(".", "_")
    if name in SECONDS:
        base += "_seconds"
    if name in COUNTERS:
        base += "_total"
    return base


_BY_MODEL = "labelled by operation and model (gen_ai.operation.name, gen_ai.request.model)"

# One sentence per instrument: what it counts, in which unit, labelled by what.
HELP = {
    POOL_PAGES: "Pages of each cache group by state: free, used (capacity less free), "
    "evictable (pages eviction or a flush may take back: tree pages nobody locks, and in "
    "slot mode the filled slots not being restored from), pinned_request, pinned_session, "
    "host (host-tier pages a retracted request will recover from) and host_evictable "
    "(host-tier pages caching a snapshot nobody will recover from); in pages, labelled by "
    "group, family and state.",
    POOL_CAPACITY: "Pages each cache group's pool holds; in pages, labelled by group and family.",
    ROOT_REFS: "References the prefix tree's root holds, as the tree counts them.",
    ROOT_REFS_EXPECTED: "References the prefix tree's root should hold: one per live holder "
    "with a lock on the tree.",
    TREE_NODES: "Nodes in the prefix tree.",
    TREE_SNAPSHOTS: "Prefix-tree nodes holding a state snapshot; labelled by group.",
    TREE_INTERIOR_SNAPSHOTS: "State snapshots on prefix-tree nodes that have children "
    "(superseded continuation states); labelled by group.",
    SESSION_PAGES: "Pages pinned by open streaming sessions; in pages, labelled by group.",
    SESSIONS_LIVE: "Open streaming sessions.",
    RECORD_BYTES: "Bytes of routed-expert records that session records retain.",
    REQUESTS_LIVE: "Requests in the engine by scheduler state (waiting, running, retracted, "
    "paused); labelled by state.",
    SLOTS_FILLED: "Slots of the slot cache that hold a prefix (slots backend only).",
    SLOT_ENTRIES: "Entries in the slot cache's prefix table (slots backend only).",
    PREFIX_QUERIED: f"Prompt tokens looked up in the prefix cache when a request is scheduled; "
    f"in tokens, {_BY_MODEL}.",
    PREFIX_HIT: f"Prompt tokens the prefix cache supplied when a request is scheduled; "
    f"in tokens, {_BY_MODEL}.",
    RETRACTIONS: "Requests pushed out of the running batch to the host tier (retractions).",
    ABORTS: "Requests aborted, by the stage they were in (queued, prefill, decode, verify, "
    "retracted, paused); labelled by stage.",
    EVICTIONS: "Cache entries evicted or pruned: a tree node, a state snapshot or a slot; "
    "labelled by kind.",
    REQUESTS_FINISHED: "Requests that ended, by reason (stop, length, abort, error); labelled "
    f"by reason, and {_BY_MODEL} when known.",
    TOKENS_GENERATED: f"Output tokens generated, speculative ones once accepted; in tokens, "
    f"{_BY_MODEL} when known.",
    PREFILL_COMPUTED: "Prompt tokens run through the model in prefill chunks; in tokens.",
    TTFT: f"Time from a request's arrival at the engine to its first output token; "
    f"in seconds, {_BY_MODEL}.",
    TPOT: f"Mean time per output token after the first, per request with two or more; "
    f"in seconds, {_BY_MODEL}.",
    REQUEST_DURATION: f"Time from a request's arrival at the engine to its end, per "
    f"finished request; in seconds, {_BY_MODEL}.",
    GATE_VERDICT: "The gate's verdict: 1 on the verdict it reached, 0 on the others; "
    "labelled by verdict (pass, fail, error).",
    GATE_DETECTOR_FAILED: "1 when a detector failed a run, 0 when it passed (absent when "
    "skipped); labelled by profile, concurrency and detector.",
    GATE_FIRST_FAIL_TURN: "The first turn at which a detector failed a run; labelled by "
    "profile, concurrency and detector.",
    GATE_RUN_REQUESTS: "Requests a gate run sent; labelled by profile and concurrency.",
    GATE_RUN_ERRORS: "Requests of a gate run that failed; labelled by profile and concurrency.",
    GATE_RUN_BROKEN: "1 when a gate run broke before it could be judged, else 0; labelled by "
    "profile and concurrency.",
    GATE_HEAP_PER_TOKEN: "Traced heap bytes per held token (the live conversations' context, "
    "or the prefix cache's tokens when it holds more) at a turn of a gate run; labelled by "
    "profile, concurrency and turn.",
}
