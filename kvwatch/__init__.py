"""kvwatch: leak detection and observability for LLM prefix caches.

The package root holds only the CLI; the engine, instrumentation, load tests
and dashboards live in their own top-level folders and import as
``kvwatch.engine``, ``kvwatch.instrumentation`` and so on.
"""

__version__ = "0.1.0"
