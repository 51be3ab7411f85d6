"""The history tier: generated client histories played on an engine in process, judged, shrunk."""
