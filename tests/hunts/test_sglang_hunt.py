"""``make sglang-hunt``'s matrix, rows and markdown, with no engine (rows in, markdown out);
and one live gate of a one-layout matrix (e2e).

The pure tests build a gate's ``summary.json`` and console by hand, so each shows the
hunt's logic failing where it should: a finding a corpus row explains is labelled with
it only on a release before that row's fix and only in that row's pool; a profile the
release cannot run is ``unsupported``, counted apart and never a finding.
"""

from __future__ import annotations

import json

import pytest
from paths import REPO

from hunts import gate_tables, gates, report
from hunts import sglang as hunt
from hunts.corpus import load_corpus, relabel
from kvwatch.targets.sglang import wheel_fetch

OWN = "sglang 0.5.10.post1: driven by its own Scheduler\n"
CORPUS = [
    {
        "id": "sglang-pr-1",
        "engine": "sglang",
        "fixed": "0.5.11",
        "gate": ["--engine", "sglang-cache", "--profile", "sessions", "-c", "4"],
        "expect": "allocator",
        "result": "{'buggy': {'evidence': 'turn 0: sglang.kv: 1 units allocated but ...'}}",
    },
    {
        "id": "sglang-stall",
        "engine": "sglang",
        "fixed": "0.5.22 (no PR found)",
        "gate": ["--engine", "sglang-cache", "--profile", "session-pressure"],
        "expect": "requests",
        "result": "{'buggy': {'evidence': 'turn 0: sglang.kv: admission stalled: ...'}}",
    },
]
LEAK = "turn 0: sglang.kv: 1 units allocated but held by no request\nmore lines"


def run(profile: str, c: int, failed: dict[str, str] | None = None, error=None) -> dict:
    detectors = {d: {"verdict": "pass"} for d in ("allocator", "requests", "quiescence")}
    detectors |= {d: {"verdict": "fail", "evidence": e} for d, e in (failed or {}).items()}
    out = {"profile": profile, "concurrency": c, "detectors": detectors}
    return out | ({"error": error} if error else {})


def group(release: str = "0.5.10.post1", cache: str = "radix", page: int = 1) -> gates.Group:
    return next(g for g in hunt.groups([release], 1) if (g.cache, g.page) == (cache, page))


def rows(runs: list[dict], console: str = OWN, release="0.5.10.post1", cache="radix") -> list:
    engine = hunt.engine(CORPUS)
    return gates.rows_of(engine, group(release, cache), {"runs": runs}, console, [2])


def test_the_matrix_is_release_by_layout_by_seed_and_mamba_runs_at_page_1_only():
    groups = hunt.groups(["0.5.9", "0.5.23"], 2)
    assert len(groups) == 2 * 7 * 2
    assert [g.layout for g in groups[:3]] == ["radix/p1"] * 2 + ["radix/p4"]
    assert {g.page for g in groups if g.cache == "mamba"} == {1}
    assert groups[0].args[-5:] == ("0.5.9", "--sglang-cache", "radix", "--page-size", "1")
    paths = ["--out", "o", "--corpus", "c.json"]
    assert hunt.parse_args(["--releases", "all", *paths]).releases == list(hunt.ALL)
    assert set(hunt.DEFAULT) <= set(hunt.ALL)


def test_a_finding_is_known_only_before_the_rows_fix_and_in_its_pool():
    leak = run("sessions", 2, {"allocator": LEAK})
    (before,) = rows([leak])
    assert before["verdict"] == "fail" and before["decided_by"] == "SGLang's own Scheduler"
    assert before["findings"] == [
        {"detector": "allocator", "evidence": LEAK.splitlines()[0], "known": "sglang-pr-1"}
    ]
    (after,) = rows([leak], console=OWN.replace("0.5.10.post1", "0.5.11"), release="0.5.11")
    assert after["findings"][0]["known"] is None  # the fixed release: a candidate
    mamba = run("sessions", 2, {"allocator": "turn 0: sglang.mamba: 1 units allocated"})
    assert rows([mamba], cache="mamba")[0]["findings"][0]["known"] is None  # another pool
    other = run("aborts", 2, {"allocator": LEAK})
    assert rows([other])[0]["findings"][0]["known"] is None  # another profile, another cause


def test_in_another_profile_a_finding_is_known_only_by_the_same_cause():
    bug = CORPUS[0] | {"id": "sglang-queued", "gate": ["--profile", "aborts"]}
    bug["result"] = (
        "{'buggy': {'evidence': 'turn 5: sglang.kv: 1 units allocated but held by no request"
        " (1 last held by request conv1-t5 mamba_pool_idx 26, aborted-in-queue at step 211)'}}"
    )
    engine = hunt.engine([bug])
    same = "turn 0: sglang.kv: 1 units (1 last held by request c-t0 mamba_pool_idx 4, aborted-in-queue at step 4)"
    other = same.replace("aborted-in-queue", "timed-out")
    stages = [run("abort-stages", 2, {"allocator": e}) for e in (same, other)]
    out = gates.rows_of(engine, group(), {"runs": stages}, OWN, [2])
    assert [r["findings"][0]["known"] for r in out] == ["sglang-queued", None]
    assert [r["findings"][0]["known"] for r in relabel(hunt.engine([]), out)] == [
        None,
        None,
    ]


def test_what_a_drain_leaves_after_a_known_stall_carries_the_stalls_id():
    stalled = run(
        "session-pressure",
        2,
        {
            "requests": "turn 0: sglang.kv: admission stalled: no batch ran",
            "quiescence": "after the drain: sessions.sessions holds 2 entries",
        },
    )
    (row,) = rows([stalled])
    assert [(f["detector"], f["known"], f.get("after_known")) for f in row["findings"]] == [
        ("quiescence", "sglang-stall", True),
        ("requests", "sglang-stall", None),
    ]
    alone = run("sessions", 2, {"quiescence": "after the drain: sessions.sessions holds 2"})
    assert rows([alone])[0]["findings"][0]["known"] is None  # no known bug in its turns


def test_a_profile_or_release_the_target_cannot_run_is_unsupported_not_a_finding():
    console = OWN + "leaving out the priority profile: not on this release\n"
    out = rows([run("agentic", 2)], console=console)
    assert [(r["profile"], r["verdict"], r["unsupported"]) for r in out] == [
        ("agentic", "pass", None),
        ("priority", "unsupported", "not on this release"),
    ]
    nothing = rows([run("agentic", 2, error="sglang at 0.5.16: no driver")], console="")
    assert nothing[0]["verdict"] == "unsupported" and nothing[0]["error"] is None
    broke = rows([run("agentic", 2, error="Traceback: boom")])
    assert broke[0]["verdict"] == "error" and broke[0]["unsupported"] is None


def test_the_markdown_counts_runs_apart_from_the_unsupported_and_keeps_the_hand_written_part(
    tmp_path,
):
    console = OWN + "leaving out the priority profile: not on this release\n"
    table = rows(
        [
            run("agentic", 2),
            run("sessions", 2, {"allocator": LEAK}),
            run("aborts", 2, {"allocator": LEAK}),
        ],
        console=console,
    )
    settings = {"matrix": "one", "jobs": 2, "cores": 2, "wall_s": 3}
    md = gate_tables.markdown(table, settings, title="T", intro=["x"])
    assert "| 0.5.10.post1 | `radix/p1` | 3 | 1 | 2 | 0 | 1 | SGLang's own Scheduler |" in md
    assert "| `allocator` | known: `sglang-pr-1` | `radix/p1` | sessions | 0.5.10.post1 |" in md
    assert "| `allocator` | **candidate** | `radix/p1` | aborts | 0.5.10.post1 |" in md
    assert "2 findings: 1 known, 1 candidates" in md
    assert "- not possible (1 runs): not on this release" in md
    out = tmp_path / "hunt"
    report.write(out, settings, table, md)
    md_path = tmp_path / "hunt.md"
    md_path.write_text(md_path.read_text() + "\n## Upstream\n\nsearched\n")
    report.write(out, settings, table[:1], md)
    assert md_path.read_text().endswith("\n## Upstream\n\nsearched\n")
    assert len(json.loads((tmp_path / "hunt.json").read_text())["runs"]) == 1


@pytest.mark.e2e
def test_one_live_gate_finds_the_known_session_leak_and_passes_the_rest():
    """0.5.10.post1, radix at page 1, seed 0, c = 2: the sessions profile fails with PR
    22862's leak and session-pressure with the stall, each labelled; the rest pass."""
    try:
        wheel_fetch.fetch("0.5.10.post1")
    except wheel_fetch.Unavailable as exc:
        pytest.skip(f"cannot download sglang 0.5.10.post1's wheel (is PyPI reachable?): {exc}")
    engine = hunt.engine(load_corpus(REPO / "docs" / "real-bugs.json"))
    out = gates.run_group(engine, group(), [2], timeout=300)
    failed = {r["profile"]: {f["known"] for f in r["findings"]} for r in out if r["findings"]}
    assert failed == {
        "sessions": {"sglang-pr-22862"},
        "session-pressure": {"sglang-admission-stall-empty-batch"},
    }
    assert {r["verdict"] for r in out if not r["findings"]} == {"pass"}
    assert {r["decided_by"] for r in out} == {"SGLang's own Scheduler"}
