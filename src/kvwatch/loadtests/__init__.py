"""kvwatch.loadtests: Locust users and load profiles (run in Locust's own process)."""
