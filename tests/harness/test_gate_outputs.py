"""Output paths: nothing a flag or a name says can place a file outside its
output directory or overwrite a file no kvwatch run wrote (exit 2, and nothing
is written)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvwatch.cli import main
from kvwatch.gate.options import GateOptions
from kvwatch.harness import outputs
from kvwatch.harness.profiles import PROFILES

BAD_NAMES = ["", ".", "..", "a/b", "../up", "a\\b", "/abs", "tab\there", "nul\x00", "del\x7f"]


@pytest.mark.parametrize("value", BAD_NAMES)
def test_a_name_is_one_plain_path_component(value, tmp_path):
    with pytest.raises(ValueError, match="profile"):
        outputs.name("profile", value)
    with pytest.raises(ValueError):
        outputs.child(tmp_path, "runs", value)


def test_every_name_the_gate_builds_a_path_from_is_plain(tmp_path):
    for name in [*PROFILES, "soak", *(f"{p}-c8" for p in PROFILES)]:
        assert outputs.child(tmp_path, "runs", name).parent == tmp_path / "runs"


def usage_error(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    return capsys.readouterr().err


def test_a_profile_name_that_walks_out_is_refused_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "out"
    for flags in (["--profile", "../../escape"], ["--soak", "10m", "--profile", "../escape"]):
        err = usage_error(capsys, "gate", "--out", str(out), *flags)
        assert "unknown profile '../" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("soak", [[], ["--soak", "10m"]])
def test_out_must_be_a_directory_the_gate_may_write(tmp_path, capsys, soak):
    source = tmp_path / "src"
    source.mkdir()
    (source / "README.md").write_text("mine")
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    cases = [
        (source, "holds files no gate run wrote (README.md)"),
        (a_file, "is a file, not a directory"),
        (tmp_path / "new\nline", "control character"),
    ]
    for out, message in cases:
        assert message in usage_error(capsys, "gate", "--out", str(out), *soak)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "src"]
    assert [p.name for p in source.iterdir()] == ["README.md"]
    assert a_file.read_text() == "mine"


def test_out_may_be_new_empty_or_an_earlier_runs(tmp_path):
    marked, older, empty = tmp_path / "marked", tmp_path / "older", tmp_path / "empty"
    outputs.mark(marked)
    (marked / "runs").mkdir()
    older.mkdir()
    (older / "summary.json").write_text("{}")
    empty.mkdir()
    for out in (marked, older, empty, tmp_path / "new" / "deeper"):
        GateOptions(out=out).validate()


def test_an_earlier_gates_outputs_go_before_a_new_gate_writes(tmp_path):
    """A reused --out keeps no run folder, report or summary of the earlier gate
    beside the new one's; a file the user put there stays."""
    out = tmp_path / "out"
    outputs.mark(out)
    for own in ("runs/agentic-trie-c8", "servers/agentic-trie", "spans/chaos", "soak"):
        (out / own).mkdir(parents=True)
        (out / own / "record.json").write_text("{}")
    for own in ("summary.json", "report.html", "gate.prom"):
        (out / own).write_text("old")
    (out / "notes.txt").write_text("mine")
    outputs.mark(out)
    assert sorted(p.name for p in out.iterdir()) == [".kvwatch-out", "notes.txt"]


@pytest.mark.parametrize("soak", [[], ["--soak", "10m"]])
def test_junit_never_overwrites_a_file_it_did_not_write(tmp_path, capsys, soak):
    out = tmp_path / "out"
    source = tmp_path / "conftest.py"
    source.write_text("mine")
    cases = [
        (source, "is not a JUnit report; refusing to overwrite it"),
        (out / "summary.json", "one of the files the gate writes"),
        (out / "runs" / "agentic-trie-c1" / "j.xml", "one of the files the gate writes"),
        (tmp_path, "is a directory"),
        (tmp_path / "j\x1b.xml", "control character"),
    ]
    for junit, message in cases:
        err = usage_error(capsys, "gate", "--out", str(out), "--junit", str(junit), *soak)
        assert message in err, (junit, err)
    assert source.read_text() == "mine" and not out.exists()


def test_junit_may_replace_an_earlier_report(tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text('<?xml version="1.0"?>\n<testsuite name="kvwatch-gate" tests="0"/>')
    GateOptions(out=tmp_path / "out", junit=report).validate()
    GateOptions(out=tmp_path / "out", junit=tmp_path / "reports" / "new.xml").validate()


def test_serve_run_dir_must_be_a_directory(tmp_path, capsys):
    a_file = tmp_path / "spans.jsonl"
    a_file.write_text("mine")
    assert "is a file" in usage_error(capsys, "serve", "--run-dir", str(a_file))
    assert "control character" in usage_error(capsys, "serve", "--run-dir", "runs/\x01")
    assert a_file.read_text() == "mine" and Path("runs/\x01").exists() is False
