"""``HashLedger``: the hash check across probes (``hit-on-other-tokens``).

The token prefix each (pool, block, hash) was first seen holding is kept; a
later holder of that block under that hash must hold the same prefix, or a
prefix hit read KV computed for other tokens. An entry goes once its block
carries another hash (it was evicted), so the ledger never outgrows the
pools, and each (entry, request) is reported once. Only reads, and imports
nothing from vLLM.
"""

from __future__ import annotations

from kvwatch.targets.vllm.check_findings import violation
from kvwatch.targets.vllm.manager_audit import HIT_ON_OTHER_TOKENS, Violation, short_hash
from kvwatch.targets.vllm.scheduler_reads import cached_blocks, group_managers, pool_index, table
from kvwatch.targets.vllm.token_hashes import covered, prefix_digests, unit_of


class HashLedger:
    """Across probes: the token prefix each (pool, block, hash) was first seen
    holding. A later holder of that block under that hash must hold the same
    prefix (``hit-on-other-tokens``). Entries go when the block's hash changes
    (it was evicted), so the ledger never outgrows the pools."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, int, object], tuple[str, str]] = {}
        self.reported: set[tuple] = set()

    def observe(self, scheduler) -> list[Violation]:
        found: list[Violation] = []
        pools = pool_index(scheduler)
        for group, manager in group_managers(scheduler):
            pool = pools[id(manager.block_pool)]
            for request_id, request in sorted(scheduler.requests.items()):
                blocks, unit = table(manager, request_id), unit_of(scheduler, manager)
                digests = prefix_digests(list(request.all_token_ids), unit)
                for i, block in cached_blocks(blocks):
                    j = covered(block, i, manager.block_size) // unit - 1
                    if 0 <= j < len(digests):
                        found += self._holder(group, pool, request_id, i, block, digests[j])
        self._forget(scheduler, pools)
        return found

    def _holder(self, group, pool, request_id, i, block, digest) -> list[Violation]:
        key = (pool, block.block_id, block.block_hash)
        first = self.seen.setdefault(key, (request_id, digest))
        if first[1] == digest or (key, request_id) in self.reported:
            return []
        self.reported.add((key, request_id))
        detail = (
            f"block {block.block_id} (group {group}) under hash {short_hash(block.block_hash)} "
            f"was first held by {first[0]} with another token prefix; {request_id} holds it at "
            f"index {i}: its KV was computed for other tokens"
        )
        return [
            violation(
                HIT_ON_OTHER_TOKENS,
                detail,
                blocks=(block.block_id,),
                requests=(first[0], request_id),
                key=block.block_hash,
                pool=pool,
                hashed=True,
                subject=f"block {block.block_id} read by {request_id}",
            )
        ]

    def _forget(self, scheduler, pools: dict[int, int]) -> None:
        by_number = {pools[id(m.block_pool)]: m.block_pool for _, m in group_managers(scheduler)}
        for key in list(self.seen):
            number, block_id, block_hash = key
            blocks = by_number[number].blocks if number in by_number else []
            if not (0 <= block_id < len(blocks) and blocks[block_id].block_hash == block_hash):
                del self.seen[key]
        self.reported = {r for r in self.reported if r[0] in self.seen}
