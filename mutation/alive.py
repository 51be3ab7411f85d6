"""Is a mutant alive? Run the engine and server programs on it, in process.

    PYTHONPATH=<mutant tree> python -m kvwatch.mutation.alive

Prints one JSON line: ``{"alive": bool, "oracle": ..., "detail": ...}``. A
mutant is alive when an oracle that does not know its name sees it (the
audit, a usage bound, quiescence, the cache-off replay, a failed request),
or when the engine raises; the first observation ends the check. A mutant
none of them sees is reported as equivalent, as far as these programs reach.
"""

from __future__ import annotations

import json
import sys
import traceback

from kvwatch.mutation import fuzz, serverfuzz


def check() -> dict:
    try:
        for program in fuzz.PROGRAMS:
            if seen := fuzz.run(program):
                return {"alive": True, "oracle": seen[0].oracle, "detail": str(seen[0])}
        for program in serverfuzz.PROGRAMS:
            if seen := serverfuzz.run(program):
                return {"alive": True, "oracle": seen[0].oracle, "detail": str(seen[0])}
    except Exception as exc:  # the mutant breaks the engine outright
        where = traceback.extract_tb(exc.__traceback__)[-1]
        detail = f"{type(exc).__name__}: {exc} ({where.filename.rsplit('/', 1)[-1]}:{where.lineno})"
        return {"alive": True, "oracle": "raised", "detail": detail[:300]}
    return {"alive": False, "oracle": None, "detail": "no oracle saw it"}


def main() -> int:
    print(json.dumps(check()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
