"""kvwatch.gate.pytest_plugin: the pytest plugin (entry point ``pytest11: kvwatch``)."""
