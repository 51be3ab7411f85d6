"""The one hunt runner and report writer (``hunts/runner.py``, ``hunts/report.py``), with units
made for the test, and the paths every hunt takes from its caller.

Units that end out of order still give rows in the matrix's order; the files go to
``--out`` with the runner's settings and the plan's, and a rerun keeps what was written
by hand below the marker. No hunt runs without ``--out`` (nor a gate hunt without
``--corpus``): nothing is read or written under the working directory by default.
"""

from __future__ import annotations

import json
import time
from argparse import Namespace

import pytest

from hunts import lightllm, report, runner, sglang, vllm


def plan(lines: list[str]) -> runner.Plan:
    def run(unit: int) -> list[dict]:
        time.sleep(0.05 * (3 - unit))  # the first unit ends last
        return [{"unit": unit, "k": k} for k in range(unit)]

    return runner.Plan(
        units=(1, 2, 3),
        run=run,
        line=lambda unit, rows: f"unit {unit}: {len(rows)} rows",
        header="3 units",
        markdown=lambda rows, settings: report.document(
            "T", ["intro"], f"Settings: {settings['matrix']}", [("Rows", [str(len(rows))])]
        ),
        footer=lambda rows, wall: f"{len(rows)} rows",
        settings={"matrix": "one by three"},
    )


def test_units_ending_out_of_order_give_rows_in_the_matrixs_order(capsys):
    results = runner.execute(plan([]), jobs=3)
    assert [[r["unit"] for r in rows] for rows in results] == [[1], [2, 2], [3, 3, 3]]
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "unit 3: 3 rows"  # it ended first: lines come as units end


def test_a_hunt_writes_its_two_files_where_it_is_told_and_keeps_the_hand_written_part(
    tmp_path, capsys
):
    out = tmp_path / "deep" / "hunt"
    args = Namespace(out=str(out), jobs=2)
    assert runner.hunt(plan([]), args) == 0
    stored = json.loads((tmp_path / "deep" / "hunt.json").read_text())
    assert [r["unit"] for r in stored["runs"]] == [1, 2, 2, 3, 3, 3]
    settings = stored["settings"]
    assert settings["matrix"] == "one by three" and settings["jobs"] == 2
    assert {"wall_s", "cores", "out"} <= set(settings)
    md = tmp_path / "deep" / "hunt.md"
    assert md.read_text().startswith("# T\n\nintro\n\nSettings: one by three\n\n## Rows\n\n6\n")
    md.write_text(md.read_text() + "\n## Upstream\n\nread by hand\n")
    runner.hunt(plan([]), args)
    assert md.read_text().endswith(report.HAND_WRITTEN + "\n\n## Upstream\n\nread by hand\n")
    said = capsys.readouterr().out.splitlines()
    assert said[0] == "3 units" and said[-1] == "6 rows"


@pytest.mark.parametrize(
    "parse, given",
    [
        (sglang.parse_args, ["--corpus", "c.json"]),
        (sglang.parse_args, ["--out", "o"]),
        (lightllm.parse_args, ["--corpus", "c.json"]),
        (lightllm.parse_args, ["--out", "o"]),
        (vllm.parse_args, []),
    ],
)
def test_no_hunt_takes_its_output_or_its_corpus_from_the_working_directory(parse, given):
    with pytest.raises(SystemExit):
        parse(given)
    full = {"--out": "o", "--corpus": "c.json"}
    wanted = [
        a for k, v in full.items() if parse is not vllm.parse_args or k == "--out" for a in (k, v)
    ]
    assert parse(wanted).out == "o"
