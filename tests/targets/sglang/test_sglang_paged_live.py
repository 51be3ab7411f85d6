"""SGLang at page size > 1, live: the gate clean at pages of 4 and 16 tokens, and the
page audit failing on bugs planted in SGLang's own allocator and tree.

``kvwatch gate --engine sglang-cache --page-size P`` runs as a user runs it (a
process per gate, the page sizes of one release and cache side by side) for
the radix and the SWA cache on 0.5.13.post1, the newest release SGLang's own
``Scheduler`` drives here with ``ServerArgs`` and the first with an SWA cache,
and on 0.5.23, the newest release (its own scheduler over ``runtime_context``);
and for the radix cache on 0.5.9,
whose paged allocator is the one in ``mem_cache/allocator.py``. Each exits 0.

The plants run one ``pressure`` workload (eviction and retraction) at page
size 4 in this process on 0.5.13.post1's own scheduler, judged by the
detectors the gate composes for this target: clean, every detector passes;
with one bug in SGLang's ``PagedTokenToKVPoolAllocator`` or ``RadixCache``,
the detector that owns its finding fails and names it. Two of the four
(a page past the pool freed, a tree node that keeps part of a page) are
seen only by the page-level rules of ``pool_audit``.

The wheels are downloaded at test time into kvwatch's cache folder (once per
machine); skipped, saying why, when PyPI cannot be reached.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
import torch

from kvwatch.gate.verdicts.detectors import detector_set
from kvwatch.targets.sglang import loop_choice, wheel_fetch, workloads
from kvwatch.targets.sglang.recording import record_run
from kvwatch.targets.sglang.target import PROFILES, SglangCacheTarget

pytestmark = pytest.mark.e2e
OWN, NEWEST, OLD_ALLOCATOR = "0.5.13.post1", "0.5.23", "0.5.9"
PAGE = 4
# docs/real-bugs.json sglang-admission-stall-empty-batch: 0.5.10rc0 .. 0.5.21 stop
# admitting on this profile at every page size (fixed in 0.5.22)
STALLS = "session-pressure"


def fetched(version: str) -> None:
    try:
        wheel_fetch.fetch(version)
    except wheel_fetch.Unavailable as exc:
        pytest.skip(f"cannot download sglang {version}'s wheel (is PyPI reachable?): {exc}")


def gates(
    version: str, cache: str, pages: tuple[int, ...], tmp_path, profiles: list[str] | None = None
) -> dict[int, tuple]:
    """One gate per page size, run at once: page -> (exit, summary, output). Every
    profile by default (on ``OWN``, all but the one that stalls there)."""
    if profiles is None:
        profiles = [p for p in PROFILES if p != STALLS] if version == OWN else []
    running = {}
    for page in pages:
        cmd = [
            *(sys.executable, "-m", "kvwatch", "gate", "--engine", "sglang-cache"),
            *("--sglang-version", version, "--sglang-cache", cache, "--page-size", str(page)),
            *(a for p in profiles for a in ("--profile", p)),
            *("-c", "4", "--out", str(tmp_path / str(page)), "--no-report"),
        ]
        running[page] = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    out = {}
    for page, process in running.items():
        output, _ = process.communicate(timeout=300)
        summary = json.loads((tmp_path / str(page) / "summary.json").read_text())
        out[page] = (process.returncode, summary, output)
    return out


@pytest.mark.parametrize(
    "version, cache, pages",
    [
        (OWN, "radix", (4, 16)),
        (OWN, "swa", (4, 16)),
        (NEWEST, "radix", (4, 16)),
        (NEWEST, "swa", (4, 16)),
        (OLD_ALLOCATOR, "radix", (4,)),
    ],
)
def test_the_gate_passes_at_pages_of_more_than_one_token(version, cache, pages, tmp_path):
    fetched(version)
    for page, (code, summary, output) in gates(version, cache, pages, tmp_path).items():
        assert code == 0, (page, output)
        assert summary["verdict"] == "pass" and summary["runs"], (page, output)
        for run in summary["runs"]:
            judged = {d: run["detectors"][d]["verdict"] for d in ("allocator", "tree")}
            assert judged == {"allocator": "pass", "tree": "pass"}, (page, run["profile"])


# docs/real-bugs.json sglang-pr-22862: a retried session turn rewrites its last position
# without freeing the old one; at page size P it leaks only when the retried prefix is a
# multiple of P, which the sessions workload's turn sizes (7, 8 or 9 new tokens) reach
@pytest.mark.parametrize("version, leaks", [("0.5.10.post1", True), ("0.5.11", False)])
def test_the_session_rewrite_leak_shows_at_every_page_size(version, leaks, tmp_path):
    fetched(version)
    ran = gates(version, "radix", (1, 4, 16), tmp_path, profiles=["sessions"])
    for page, (code, summary, output) in ran.items():
        assert code == (1 if leaks else 0), (page, output)
        (run,) = summary["runs"]
        want = "fail" if leaks else "pass"
        assert run["detectors"]["allocator"]["verdict"] == want, (page, output)


# -- bugs planted in SGLang's own classes ------------------------------------------------------
@pytest.fixture(scope="module")
def release():
    fetched(OWN)
    return loop_choice.load(OWN)


def judged(release) -> tuple[Any, dict]:
    """The pressure workload at page size 4 on ``release``: its record and verdicts."""
    workload = workloads.WORKLOADS["pressure"](c=4, seed=0, page_size=PAGE, cache="radix")
    record = record_run(release, workload, turns=4, warmup=1)
    return record, detector_set(SglangCacheTarget.signals).judge(record)


def drop_a_freed_page(monkeypatch, release, planted: list) -> None:
    """The first free of two or more pages outside a free group loses its last page."""
    allocator = release.module("allocator").PagedTokenToKVPoolAllocator
    free = allocator.free

    def dropping(self, index):
        pages = torch.unique(index // self.page_size)
        if not planted and self.is_not_in_free_group and len(pages) > 1:
            planted.append(int(pages[-1]))
            index = index[index // self.page_size != pages[-1]]
        return free(self, index)

    monkeypatch.setattr(allocator, "free", dropping)


def free_a_page_past_the_pool(monkeypatch, release, planted: list) -> None:
    """The first free outside a free group also puts the page past the last on the free list."""
    allocator = release.module("allocator").PagedTokenToKVPoolAllocator
    free = allocator.free

    def widening(self, index):
        out = free(self, index)
        if not planted and self.is_not_in_free_group and index.numel():
            planted.append(self.num_pages + 1)
            extra = torch.tensor([self.num_pages + 1], dtype=self.free_pages.dtype)
            self.free_pages = torch.cat((self.free_pages, extra))
        return out

    monkeypatch.setattr(allocator, "free", widening)


def count_a_lock_a_page_high(monkeypatch, release, planted: list) -> None:
    """The first lock of a node adds a page too many to ``protected_size_``."""
    radix = release.cls("radix")
    lock = radix.inc_lock_ref

    def miscounting(self, node):
        out = lock(self, node)
        if not planted and node is not self.root_node:
            planted.append(node.id)
            self.protected_size_ += self.page_size
        return out

    monkeypatch.setattr(radix, "inc_lock_ref", miscounting)


def keep_an_unaligned_tail(monkeypatch, release, planted: list) -> None:
    """The first finished request whose tokens end inside a page is cached with its key
    left unaligned: the tree keeps its last, partial page."""
    radix = release.cls("radix")
    key = release.module("radix").RadixKey
    aligned, finish = key.page_aligned, radix.cache_finished_req
    tried: list[bool] = []

    def unaligned(self, page_size):
        if len(self) % page_size:
            tried.append(True)
            return self
        return aligned(self, page_size)

    def finishing(self, *args, **kwargs):
        if planted:
            return finish(self, *args, **kwargs)
        monkeypatch.setattr(key, "page_aligned", unaligned)
        try:
            return finish(self, *args, **kwargs)
        finally:
            monkeypatch.setattr(key, "page_aligned", aligned)
            planted.extend(tried[:1])

    monkeypatch.setattr(radix, "cache_finished_req", finishing)


def test_the_pressure_workload_at_page_size_4_passes_clean(release):
    record, verdicts = judged(release)
    assert record.error is None and record.turns
    assert {d: v.verdict for d, v in verdicts.items()} == dict.fromkeys(verdicts, "pass")


@pytest.mark.parametrize(
    "plant, detector, says",
    [
        (drop_a_freed_page, "allocator", "allocated but held by no request"),
        (free_a_page_past_the_pool, "allocator", "units outside the pool's"),
        (count_a_lock_a_page_high, "tree", "RadixCache full.protected is"),
        (keep_an_unaligned_tail, "tree", f"pages of {PAGE}"),
    ],
    ids=lambda p: getattr(p, "__name__", None),
)
def test_a_bug_planted_at_page_size_4_fails_its_detector(
    release, monkeypatch, plant, detector, says
):
    planted: list = []
    plant(monkeypatch, release, planted)
    record, verdicts = judged(release)
    assert planted and record.error is None, (planted, record.error)
    failed = {d for d, v in verdicts.items() if v.verdict == "fail"}
    assert failed == {detector}, {d: v.evidence for d, v in verdicts.items()}
    evidence = " ".join(e.detail for e in verdicts[detector].evidence)
    assert says in evidence and "sglang.kv" in evidence, evidence
