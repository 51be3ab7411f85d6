"""kvwatch.gate.outputs: judged runs written out, every output from the typed summary."""
