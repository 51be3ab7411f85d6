"""What would catch each mutant the gate let through, by mutant id.

Written by hand after reading the survivor's run: the one part of
``docs/mutation-score.md`` that is not generated.
"""

from __future__ import annotations

NOTES: dict[str, str] = {}
