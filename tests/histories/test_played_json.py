"""A played history survives the trip to JSON and back whole, so a history played in a
driver process (vLLM's Python) is judged as one played here."""

from __future__ import annotations

import json

import pytest

from kvwatch.histories.checks import judge
from kvwatch.histories.generate import Plan, generate
from kvwatch.histories.hunt import play_on
from kvwatch.histories.played_json import played_from_json, played_to_json
from kvwatch.targets.kvwatch.histories import KvwatchHistoryTarget

PLAN = Plan(turns=3, ops_per_turn=10)


@pytest.mark.parametrize(
    "faults,seed", [((), 0), (("evict-parent-unannounced",), 1), (("aborted-holder-parked",), 2)]
)
def test_a_played_history_round_trips_through_json(faults, seed):
    target = KvwatchHistoryTarget(faults=faults)
    played, unasked = play_on(target, generate(target.shape, seed, PLAN))
    assert played.cache_log and played.reports is not None and played.final is not None
    back = played_from_json(json.loads(json.dumps(played_to_json(played))))
    assert back == played
    assert judge(back, unasked, None) == judge(played, unasked, None)


def test_every_field_of_a_history_with_findings_and_refusals_survives():
    target = KvwatchHistoryTarget(faults=("evict-parent-unannounced",))
    for seed in range(8):
        played, unasked = play_on(target, generate(target.shape, seed, PLAN))
        if judge(played, unasked, None).findings and played.stages and played.aborted_in:
            break
    else:
        raise AssertionError("no seed of 0-7 gave a history with findings and aborts")
    back = played_from_json(json.loads(json.dumps(played_to_json(played))))
    for name in played.__dataclass_fields__:
        assert getattr(back, name) == getattr(played, name), name


def test_an_unknown_cache_log_entry_is_refused_by_name():
    target = KvwatchHistoryTarget()
    played, _ = play_on(target, generate(target.shape, 0, Plan(turns=1, ops_per_turn=3)))
    data = played_to_json(played)
    data["cache_log"] = [["Teleported", {}]]
    with pytest.raises(ValueError, match="Teleported"):
        played_from_json(data)
