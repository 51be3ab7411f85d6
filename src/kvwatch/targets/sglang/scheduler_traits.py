"""What a release's scheduler does differently, read from the release's own files.

The shims play SGLang's ``Scheduler`` (too big to import: ZMQ, model
workers, a tokenizer). Where releases differ in the calls it makes, the shim
does not guess from version numbers: each trait is a line of the release's
``managers/scheduler.py`` (or another file), and holds when that line is
there. ``Traits.evidence`` keeps the line found for each trait that holds,
so a run can say why it made the calls it made.

Invariant: a trait is True exactly when its snippet (or one of its
alternatives) is a substring of a line of its file in the extracted wheel.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

# trait -> (file under sglang/srt, the text that makes it hold, or alternatives)
SNIPPETS: dict[str, tuple[str, str | tuple[str, ...]]] = {
    # 0.5.4-0.5.5: the stashed chunked request gives its req_to_token row back
    "stash_frees_req_slot": (
        "managers/scheduler.py",
        "# chunked request keeps its rid but will get a new req_pool_idx",
    ),
    # 0.5.5: a queued request aborted with a mamba slot goes through cache_finished_req
    "queued_abort_cache_finished": (
        "managers/scheduler.py",
        "self.tree_cache.cache_finished_req(req, is_insert=False)",
    ),
    # 0.5.10rc0+: ... through common.release_kv_cache
    "queued_abort_release_kv": (
        "managers/scheduler.py",
        "release_kv_cache(req, self.tree_cache, is_insert=False)",
    ),
    # 0.5.10+: a request the prefill adder rejects gives back the mamba slot its match copied
    "revert_mamba_on_reject": ("managers/scheduler.py", "# revert matched mamba idx"),
    # 0.5.10rc0+: requests waiting past SGLANG_REQ_WAITING_TIMEOUT leave the queue
    # (0.5.20+: as AbortReqs that abort_request handles)
    "waiting_timeout": (
        "managers/scheduler.py",
        ("def _abort_on_waiting_timeout(self):", "def _poll_timeout_aborts(self)"),
    ),
    # 0.5.10rc0+: finished requests go through common.release_kv_cache
    "release_kv_cache": ("mem_cache/common.py", "def release_kv_cache("),
    # 0.5.11+: a deferred session close is finished by maybe_reap
    "deferred_session_close": ("session/session_controller.py", "close_on_finish"),
    # 0.5.13+: a chunked request counts its in-flight middle chunks (was is_chunked)
    "inflight_middle_chunks": ("managers/schedule_batch.py", "self.inflight_middle_chunks = 0"),
    # 0.5.13+: Req keeps token ids in array("q"), not lists
    "array_tokens": ("managers/schedule_batch.py", 'self.output_ids = array("q")'),
    # 0.5.16+: a request's KV record is a ReqKvInfo (req.kv)
    "kv_info": ("managers/schedule_batch.py", "class ReqKvInfo"),
    # 0.5.22+: requests are published with checkpoint_kv_cache and hold a TreeLock
    "checkpoint_api": ("mem_cache/common.py", "def checkpoint_kv_cache("),
}


class Traits(NamedTuple):
    stash_frees_req_slot: bool
    queued_abort_cache_finished: bool
    queued_abort_release_kv: bool
    revert_mamba_on_reject: bool
    waiting_timeout: bool
    release_kv_cache: bool
    deferred_session_close: bool
    inflight_middle_chunks: bool
    array_tokens: bool
    kv_info: bool
    checkpoint_api: bool
    evidence: dict[str, str]  # trait -> "file:line: text"


def first_line(path: Path, snippets: tuple[str, ...]) -> tuple[int, str] | None:
    lines = path.read_text().splitlines() if path.is_file() else []
    for number, line in enumerate(lines, 1):
        if any(s in line for s in snippets):
            return number, line.strip()
    return None


def read(root: Path) -> Traits:
    """The traits of the release extracted at ``root`` (the parent of its ``sglang``)."""
    srt = root / "sglang" / "srt"
    found, evidence = {}, {}
    for trait, (file, snippets) in SNIPPETS.items():
        alternatives = (snippets,) if isinstance(snippets, str) else snippets
        hit = first_line(srt / file, alternatives)
        found[trait] = hit is not None
        if hit is not None:
            evidence[trait] = f"{file}:{hit[0]}: {hit[1]}"
    return Traits(**found, evidence=evidence)
