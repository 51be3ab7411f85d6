"""kvwatch: leak detection and observability for LLM prefix caches.

The package root holds only the CLI; the engine, instrumentation, load tests
and dashboards live in their own top-level folders and import as
``kvwatch.engine``, ``kvwatch.instrumentation`` and so on.
"""

__version__ = "0.1.0"

# The name `kvwatch serve` serves its reference model under, and the one load
# profiles ask for by default.
MODEL_NAME = "kvwatch-tiny-hybrid"
