"""Other engines as gate targets: vLLM started and patched from here."""
