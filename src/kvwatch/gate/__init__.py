"""kvwatch.gate: the leak gate, from a recorded run to its verdict and outputs."""
