"""Is a mutant alive? Run the engine and server programs on it, in process.

    PYTHONPATH=<mutant tree> python -m mutation.alive [PROGRAM]...

Prints one JSON line: ``{"alive": bool, "oracle": ..., "detail": ...}``. A
mutant is alive when an oracle that does not know its name sees it (the
audit, a usage bound, quiescence, the cache-off replay, a failed request),
or when the engine raises; the first observation ends the check. With no
argument the programs are ``fuzz.PROGRAMS`` and ``serverfuzz.PROGRAMS``;
named ones (``radix-pressure-failpoints/3``) are ``fuzz.DIRECTED`` programs,
which ``score.py`` picks for a mutant's line (``reach.py``). A mutant none
of them sees is reported as equivalent, as far as these programs reach.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Sequence

from mutation import fuzz, serverfuzz


def check(names: Sequence[str] = ()) -> dict:
    if names:
        directed = {p.name: p for p in fuzz.DIRECTED}
        runs = [(fuzz.run, directed[name]) for name in names]
    else:
        runs = [(fuzz.run, p) for p in fuzz.PROGRAMS]
        runs += [(serverfuzz.run, p) for p in serverfuzz.PROGRAMS]
    try:
        for run, program in runs:
            if seen := run(program):
                return {"alive": True, "oracle": seen[0].oracle, "detail": str(seen[0])}
    except Exception as exc:  # the mutant breaks the engine outright
        where = traceback.extract_tb(exc.__traceback__)[-1]
        detail = f"{type(exc).__name__}: {exc} ({where.filename.rsplit('/', 1)[-1]}:{where.lineno})"
        return {"alive": True, "oracle": "raised", "detail": detail[:300]}
    return {"alive": False, "oracle": None, "detail": "no oracle saw it"}


def main() -> int:
    print(json.dumps(check(sys.argv[1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
