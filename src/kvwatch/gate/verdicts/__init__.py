"""kvwatch.gate.verdicts: a run record judged, by pure functions of the record."""
