"""kvwatch.harness: what a load run needs, shared by the gate, the targets and the Locust process."""
