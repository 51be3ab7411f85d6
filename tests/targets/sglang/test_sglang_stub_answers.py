"""What 0.5.22's and 0.5.23's own scheduler reads as data from modules that
would otherwise be stubs is what a single-rank CPU server reads
(docs/sglang-stubs-audit.md): no stub delayer in front of admission, no stub
base under ``Req``, a one-rank tree-cache group, no state capturer, no MLX
backend, a model that is no DeepSeek DSA one, no unified-KV triton backend, the
release's own grammar manager with nothing queued.

Each assertion fails with the stub the host served before the audit (a
``Stub`` is not ``None``, and ``Req`` derived from a stub class read every
missing attribute as a falsy stub). The wheels are downloaded at test time;
skipped, saying why, when PyPI cannot be reached.
"""

from __future__ import annotations

import importlib

import pytest
from sglang_drive import drive, load

from kvwatch.targets.sglang import scheduler_workloads
from kvwatch.targets.stand_ins import Stub

pytestmark = pytest.mark.e2e
VERSIONS = ("0.5.22", "0.5.23")
COMPONENTS = "sglang.srt.managers.scheduler_components"
MODEL_CONFIG = "sglang.srt.configs.model_config"
GATES = {  # where each release keeps is_unified_kv_triton
    "0.5.22": "sglang.kernels.ops.attention.dsv4.unified_kv_kernels.env_gate",
    "0.5.23": "sglang.srt.layers.attention.dsv4.unified_kv_gate",
}


@pytest.fixture(scope="module", params=VERSIONS)
def release(request):
    return load(request.param)


@pytest.fixture(scope="module")
def built(release):
    """The release's scheduler after one turn of the abort-stages profile, and
    what its modules answer (read while the release is active)."""

    def answers(driver):
        results = importlib.import_module(f"{COMPONENTS}.batch_result_processor")
        return driver.sched, {
            "indexer": results.get_global_indexer_capturer(),
            "experts": results.get_global_experts_capturer(),
            "mlx": importlib.import_module("sglang.srt.managers.scheduler").use_mlx(),
            "req": importlib.import_module("sglang.srt.managers.schedule_batch").Req,
            "dsa": importlib.import_module(MODEL_CONFIG).is_deepseek_dsa(None),
            "unified_kv": importlib.import_module(GATES[release.version]).is_unified_kv_triton(),
        }

    return drive(release, scheduler_workloads.AbortStages(c=2, seed=0, cache="radix"), then=answers)


def stubbed(cls: type) -> list[str]:
    return [c.__name__ for c in cls.__mro__ if vars(c).get("_stub_class")]


def test_req_has_no_stub_base(built):
    _, answers = built
    assert stubbed(answers["req"]) == []


def test_admission_has_no_stub_delayer(built):
    scheduler, _ = built
    assert scheduler.min_free_slots_delayer is None


def test_the_tree_cache_group_is_one_rank(built):
    scheduler, _ = built
    assert scheduler.tree_cache.tp_world_size == 1


def test_no_state_capturer_no_mlx_no_dsa_model_no_unified_kv(built):
    _, answers = built
    assert {k: v for k, v in answers.items() if k != "req"} == {
        "indexer": None,
        "experts": None,
        "mlx": False,
        "dsa": False,
        "unified_kv": False,
    }


def test_the_grammar_manager_is_the_release_and_holds_nothing(built):
    scheduler, _ = built
    manager = scheduler.grammar_manager
    assert not isinstance(manager, Stub)
    assert type(manager).__module__ == "sglang.srt.constrained.grammar_manager"
    assert manager.grammar_queue == [] and not manager.has_waiting_grammars()
