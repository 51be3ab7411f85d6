"""The shared in-process driver: the ``EngineLoop`` contract an engine kvwatch steps itself
keeps, the ``Workload`` base, ``record_run`` under kvwatch's recorder, the per-step probe's
memory, and a driver process per run (``README.md``)."""
