"""The hunts: kvwatch run over a matrix of engine builds, layouts, profiles and seeds.

Run from the repository's root (``python -m hunts.sglang ...``, as the Makefile
does); they live beside ``mutation/``, out of the wheel.
"""
