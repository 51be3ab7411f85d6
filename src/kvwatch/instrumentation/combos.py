"""Combination and boundary machines, as data: what no single lifecycle shows.

``coverage.py`` counts each state machine alone, so a bug that needs two
things at once, or a prompt that parts from the cache at one offset of a
page, is never asked for. These machines name those products and edges;
``coverage.MACHINES`` registers them beside the lifecycles, and
``combo_counter.CombinationCounter`` counts them from the engine's events.
Each is ``(name, states, edges)``: the same shape as ``coverage.Machine``.

Combinations::

    turn abort   a session turn aborted at each request stage
                 (queued -> aborted ... recovering -> aborted; a turn never waits
                 behind a sharer, so "waiting -> aborted" would show as unlisted)
    same path    a retraction, a recovery or an eviction while another request
                 on the same path prefills, is queued (queued or waiting) or is
                 retracted. Same path: equal ``path_key`` (``engine/paths.py``),
                 the digest of the prompt's first full page (RequestAdded), or of
                 the evicted node's path's first page (NodeEvicted): both
                 descend into the same child of the root. Coarse on purpose:
                 every conversation under one system prompt shares a key
    session op   a close, a rollback and the idle timeout against the session's
                 turn: none in flight ("no turn"), in flight but not computing
                 ("queued": queued, waiting, retracted or paused, its slot
                 parked or not taken yet), computing ("running": prefilling,
                 decoding, verifying, recovering), or cut (the last turn was
                 aborted or failed, no new one started). A close or rollback
                 with a turn in flight is refused (409 ``session_busy``,
                 SessionBusy), and so is the idle timeout's close; "refused ->
                 closed | timed out": the session a client's close was refused
                 for, closed later by a retried close or by the idle timeout

Boundaries (P = page size, W = sliding window, the gate's geometry)::

    page offset    where an admitted prompt parts from the cache it matched
                   (RequestScheduled.branch_tokens b, 0 < b < prompt length), b mod P:
                   every offset, the last token of a page (P - 1) and the first
                   of the next (0) included
    window offset  the same b mod W, for the sliding-window groups
    prompt end     admitted prompts whose length is P - 1, 0 or 1 mod P, and W - 1,
                   0 or 1 mod W
    siblings       a prompt admitted while another one on its path, of the same
                   length and different (``prompt_key``), is in flight
"""

from __future__ import annotations

from kvwatch.engine.cache.failpoints import Site

# The gate's geometry: CacheConfig's default full.kv page size and window (a
# test checks they agree). A server with another geometry counts its offsets
# all the same; they show as unlisted.
PAGE = 16
WINDOW = 32

TURN_ABORT = "turn abort"
SAME_PATH = "same path"
SESSION_OP = "session op"
PAGE_OFFSET = "page offset"
WINDOW_OFFSET = "window offset"
PROMPT_END = "prompt end"
SIBLINGS = "siblings"
FAILPOINT = "failpoint"

TURN_STAGES = ("queued", "prefilling", "decoding", "verifying", "retracted", "paused", "recovering")
MOVERS = ("retracted", "recovered", "evicted")
OTHERS = ("prefilling", "queued", "retracted")  # what the other request on the path is doing
TURN_STATES = ("no turn", "queued", "running", "cut")

# session op: (action, turn state, outcome)
SESSION_OPS = (
    ("close", "no turn", "closed"),
    ("close", "queued", "refused"),
    ("close", "running", "refused"),
    ("close", "cut", "closed"),
    ("close", "refused", "closed"),
    ("rollback", "no turn", "rolled back"),
    ("rollback", "queued", "refused"),
    ("rollback", "running", "refused"),
    ("rollback", "cut", "rolled back"),
    ("idle timeout", "no turn", "timed out"),
    ("idle timeout", "queued", "refused"),
    ("idle timeout", "running", "refused"),
    ("idle timeout", "cut", "timed out"),
    ("idle timeout", "refused", "timed out"),
)


def same_path(mover: str, other: str) -> str:
    return f"{mover} while another is {other}"


def session_op(action: str, turn: str, outcome: str) -> str:
    return f"{action}: {turn} -> {outcome}"


def offset(b: int, modulus: int) -> str:
    return f"branch at {b % modulus} mod {modulus}"


def failed(site: str) -> str:
    return f"{site} failed"


def prompt_end(residue: int, modulus: int) -> str:
    return f"prompt ends at {residue} mod {modulus}"


EQUAL_LENGTH = "equal length, in flight together"
ENDS = {PAGE: (PAGE - 1, 0, 1), WINDOW: (WINDOW - 1, 0, 1)}  # modulus -> residues

MACHINES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    (TURN_ABORT, (*TURN_STAGES, "aborted"), tuple(f"{s} -> aborted" for s in TURN_STAGES)),
    (
        SAME_PATH,
        (*MOVERS, *OTHERS),
        tuple(same_path(m, o) for m in MOVERS for o in OTHERS),
    ),
    (
        SESSION_OP,
        (*TURN_STATES, "refused", "closed", "rolled back", "timed out"),
        tuple(session_op(*op) for op in SESSION_OPS),
    ),
    (PAGE_OFFSET, tuple(str(k) for k in range(PAGE)), tuple(offset(k, PAGE) for k in range(PAGE))),
    (
        WINDOW_OFFSET,
        tuple(str(k) for k in range(WINDOW)),
        tuple(offset(k, WINDOW) for k in range(WINDOW)),
    ),
    (
        PROMPT_END,
        tuple(str(r) for r in sorted({r for rs in ENDS.values() for r in rs})),
        tuple(prompt_end(r, m) for m, rs in ENDS.items() for r in rs),
    ),
    (SIBLINGS, ("equal length",), (EQUAL_LENGTH,)),
    (FAILPOINT, tuple(str(s) for s in Site), tuple(failed(s) for s in Site)),
)
