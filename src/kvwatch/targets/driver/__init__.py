"""What the targets that step an engine themselves share: the per-step probe's memory and
a driver process per run (the shared in-process driver joins them)."""
