"""White-box checks of a live vLLM scheduler that its block pool's own bookkeeping cannot see.

``manager_audit.py`` checks that ref counts, the free queue, the prefix map and
the block tables agree with each other. These check them against what they
describe, and against time:

hashes and tokens (``check_hashes``, ``HashLedger``)
    A prefix hash names the tokens whose KV a block holds. Each request's
    ``block_hashes`` are recomputed from its tokens with the request's own
    hasher (so cache salt, LoRA and multimodal keys count as vLLM counts
    them), and compared with what the request and its cached blocks carry:

    ``request-hash-stale``   ``block_hashes[i]`` is not the hash its tokens make
                             (the first such index), or there are more hashes
                             than the tokens make
    ``block-hash-vs-tokens`` a cached block in a live request's table carries
                             another hash than that request's tokens make there:
                             the prefix map files this KV under other tokens
    ``block-beyond-tokens``  a cached block's hash covers more tokens than the
                             request has
    ``partial-hash-span``    a cached block's hash covers a token count that is
                             not a hash-unit boundary inside that block
    ``shared-block-tokens``  two live requests hold one cached block with
                             different token prefixes up to its end
    ``hit-on-other-tokens``  (across probes) a block is held under one hash by a
                             request whose prefix differs from its first holder's:
                             a prefix hit that reads KV computed for other tokens

    Hashes may be finer than blocks (vLLM's ``hash_block_size``, set by
    ``prefix_match_unit`` or by groups of different block sizes): the request's
    hashes are one per ``unit`` tokens, a block's ``block_hash`` covers
    ``block_hash_num_tokens`` of them (a full block its end; a partial entry
    of ``cache_partial_block`` a boundary inside it), and the other keys the
    pool files the block under (``cached_block_hashes_by_block``) must be the
    request's hashes at boundaries inside the block. Prefixes are compared up
    to the tokens the hash covers, not to the block's end.

per-step scratch (``check_scratch``, ``registries``: ``scratch.py``)
    Every list, set, deque and dict the ``KVCacheManager``, its coordinator
    and each group's manager keep, by attribute path:

    ``scratch-not-drained``  with no live request, one of block ids or blocks is
                             not empty (state meant for one step kept past it)
    ``scratch-over-pool``    one holds more entries than the pool has blocks
    ``dead-request-key``     a dict keyed by request ids keeps ids the scheduler
                             no longer knows and that hold no blocks (a request
                             that still holds blocks is the audit's
                             ``orphan-holder``, ``req_to_blocks`` too)

    ``registries`` gives their sizes, which the gate compares before and
    after a run (the quiescence detector).

liveness (``LivenessTracker``, ``liveness.py``: ``before`` and ``after`` each
``schedule()``)
    ``running-skipped``      a running request that holds blocks and has work
                             left was neither scheduled nor preempted by a step
                             that left token budget, and no request that could
                             not get blocks (preempted, after every scheduled
                             one) ended the walk before it
    ``running-starved``      the same for more than ``bound`` steps in a row,
                             without the reasoning about order
    ``scheduler-stalled``    (the in-process driver) ``STALL`` steps in a row
                             scheduled nothing with nothing in flight while
                             requests had work left and no session paused for
                             input held blocks: nothing will ever move
    ``reset-refused``        (the in-process driver) a forced prefix-cache reset
                             (``reset_running_requests``) preempted the running
                             requests and still left the index standing

    Known blind spots: a step may skip a request for reasons these objects do
    not show (a multimodal encoder budget); the engine says which requests it
    held back itself through ``deferred``. Mamba's block-aligned splits are
    recomputed from the budget the walk had left (``liveness.aligned_split``), and
    the local prefill cadence's hold of running prefill chunks from the scheduler's
    own counters before the step (``liveness.prefill_held``).

Everything here only reads and imports nothing from vLLM (duck-typed, as
``manager_audit.py``), so it runs in vLLM's engine core between two steps, or in
the in-process driver (``loop.py``) after each ``schedule()``.
Each finding is a ``manager_audit.Violation``; ``manager_audit.KINDS`` maps each
rule to the finding kind whose detector owns it.

This module names the rules; each family lives in its own module:
``hash_checks.py`` (``check_hashes``), ``hash_ledger.py`` (``HashLedger``),
``scratch.py`` and ``liveness.py``, over ``scheduler_reads.py`` (what they read
of the scheduler), ``token_hashes.py`` (what a request's tokens make) and
``check_findings.py`` (how a finding is written). The hash checks and the
token helpers they rest on are imported from here too.
"""

from __future__ import annotations

from kvwatch.targets.vllm.hash_checks import check_hashes
from kvwatch.targets.vllm.hash_ledger import HashLedger
from kvwatch.targets.vllm.token_hashes import covered, unit_of

__all__ = ["HashLedger", "check_hashes", "covered", "unit_of"]
