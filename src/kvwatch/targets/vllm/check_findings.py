"""How a white-box check of vLLM writes a finding.

``violation`` builds the ``manager_audit.Violation`` every check returns, with
a block's key or a request's hash in short form (``hex_of``) and a subject
that stays the same while the counts in its detail move; ``NAMED`` bounds the
ids one finding names. Imports nothing from vLLM.
"""

from __future__ import annotations

from kvwatch.targets.vllm.manager_audit import Violation, short_hash

NAMED = 20  # ids kept in one finding


def hex_of(block_hash) -> str | None:
    """A request's block hash (no group id) in short form."""
    if block_hash is None:
        return None
    return block_hash[:6].hex() if isinstance(block_hash, bytes) else repr(block_hash)[:16]


def violation(
    rule, detail, *, blocks=(), requests=(), key=None, pool=0, hashed=False, subject=""
) -> Violation:
    """A finding; ``key`` is a block's key (``hashed``: with its group id) or a request's
    hash; ``subject`` what it is about, where its detail carries counts that move."""
    shown = short_hash(key) if hashed else hex_of(key)
    return Violation(
        rule=rule,
        detail=detail,
        blocks=tuple(blocks),
        requests=tuple(requests),
        hash=shown,
        pool=pool,
        subject=subject,
    )
