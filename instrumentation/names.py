"""Every metric, span and attribute name kvwatch emits, in one place.

Dashboards and detectors import these; nothing else spells a name. GenAI
names follow the OpenTelemetry GenAI semantic conventions where one exists.
"""

from __future__ import annotations

METER = "kvwatch"
TRACER = "kvwatch"

# -- pool and cache gauges ------------------------------------------------------------------
POOL_PAGES = "kvwatch.pool.pages"  # {group, family, state}
POOL_CAPACITY = "kvwatch.pool.capacity"  # {group, family}
POOL_STATES = ("free", "used", "evictable", "pinned_request", "pinned_session", "host")
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
EVICTIONS = "kvwatch.evictions"  # {kind}: node, snapshot, slot
REQUESTS_FINISHED = "kvwatch.requests.finished"  # {reason}

# -- GenAI latency histograms (seconds) ------------------------------------------------------
TTFT = "gen_ai.server.time_to_first_token"
TPOT = "gen_ai.server.time_per_output_token"
REQUEST_DURATION = "gen_ai.server.request.duration"

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
