"""What each target never judges, and why, is written down: targets/README.md's table
"Checks a target skips" is the one its classes' signals give (a detector whose needs
a target's records do not carry is skipped there, never passed)."""

from __future__ import annotations

from paths import PACKAGE

from kvwatch.gate.verdicts.detectors import IDS, skipped_for
from kvwatch.targets.http.target import HttpTarget
from kvwatch.targets.kvwatch.target import KvwatchTarget
from kvwatch.targets.lightllm.target import LightllmCacheTarget
from kvwatch.targets.sglang.target import SglangCacheTarget
from kvwatch.targets.vllm.scheduler_target import VllmSchedulerTarget
from kvwatch.targets.vllm.target import VllmTarget

TARGETS = {
    "`--engine kvwatch`": KvwatchTarget,
    "`--target URL` (http)": HttpTarget,
    "`--engine vllm`": VllmTarget,
    "`--engine vllm-scheduler`": VllmSchedulerTarget,
    "`--engine sglang-cache`": SglangCacheTarget,
    "`--engine lightllm-cache`": LightllmCacheTarget,
}


def table() -> str:
    lines = ["| target | skips (the signals its records lack) |", "|---|---|"]
    for name, target in TARGETS.items():
        skipped = skipped_for(target.signals)
        said = "; ".join(f"`{d}` ({', '.join(why)})" for d, why in skipped.items())
        lines.append(f"| {name} | {said or 'nothing: every detector judges it'} |")
    return "\n".join(lines)


def test_the_readme_lists_what_each_target_skips():
    readme = (PACKAGE / "targets" / "README.md").read_text()
    assert table() in readme, "targets/README.md's skip table is stale:\n" + table()


def test_every_target_is_judged_by_some_detector_and_kvwatch_by_all():
    assert skipped_for(KvwatchTarget.signals) == {}
    for target in TARGETS.values():
        assert len(skipped_for(target.signals)) < len(IDS)
