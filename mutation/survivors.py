"""What would catch each mutant the gate let through, by mutant id.

Written by hand after reading the survivor's run: the one part of
``docs/mutation-score.md`` that is not generated.
"""

from __future__ import annotations

NOTES: dict[str, str] = {
    "engine/cache/hybrid.py:2": (
        "the leak is on the path where a match locked a cached prefix and then could not "
        "allocate its working pages (PoolExhausted at admission); it leaves a ref on every "
        "ancestor of the anchor. No gate profile admits into pools that full; the engine "
        "program's 48-page pools do, and the audit reports root refs above what the live "
        "holders imply. A profile that keeps its pools full while cached prompts arrive "
        "would show it to `refcount`."
    ),
}
