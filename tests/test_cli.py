"""The CLI contract: `kvwatch faults [--json]`, usage errors, and what `kvwatch serve`
says on stderr. Every error is checked through the real entry point, as one line
that names the problem, with its exit code."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kvwatch.engine.faults import ENV_VAR, Fault, faults_from_env, parse_faults

CACHE_FAULTS = {
    "interior-snapshot-leak": "000",
    "snapshot-release-ignores-host-refs": "000",
    "history-only-anchor": "000",
    "root-ref-leak-on-miss": "002",
    "root-in-evict-set": "002",
    "stale-slot-entry": "004",
}


def kvwatch(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvwatch", *args], capture_output=True, text=True, cwd=cwd
    )


def one_line_error(out: subprocess.CompletedProcess, code: int) -> str:
    """The one line a failed command wrote to stderr (and nothing to stdout), having
    exited with ``code``."""
    assert out.returncode == code, (out.returncode, out.stderr)
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and out.stderr.endswith("\n"), out.stderr
    assert out.stdout == "", out.stdout
    return lines[0]


def test_faults_json_lists_every_fault_with_its_seed():
    out = kvwatch("faults", "--json")
    assert out.returncode == 0, out.stderr
    entries = {e["name"]: e for e in json.loads(out.stdout)}
    assert {name: e["seed"] for name, e in entries.items() if name in CACHE_FAULTS} == CACHE_FAULTS
    assert set(entries) == {f.value for f in Fault}
    assert all(e["summary"] and e["layer"] for e in entries.values())
    assert entries["stale-slot-entry"]["profile"] == "slot-cache"
    assert entries["stale-slot-entry"]["detector"] == "slot-table"


def test_faults_table_is_human_readable():
    out = kvwatch("faults")
    assert out.returncode == 0
    header, *rows = out.stdout.splitlines()
    assert header.split()[:3] == ["fault", "seed", "summary"]
    assert {tuple(row.split()[:2]) for row in rows} >= set(CACHE_FAULTS.items())
    assert "caught by allocator on profile agentic-trie" in rows[1]  # interior-snapshot-leak


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["no-such-command"],
            "kvwatch: error: argument command: invalid choice: 'no-such-command'",
        ),
        (["faults", "--bogus"], "kvwatch faults: error: unrecognized arguments: --bogus"),
        (
            ["gate", "--profiel", "x"],
            "kvwatch gate: error: unrecognized arguments: --profiel x; did you mean --profile?",
        ),
        (["gate", "-c", "1,2,1"], "kvwatch gate: error: argument -c: lists 1 more than once"),
        (["gate", "-c", "1", "-c", "2,1"], "kvwatch gate: error: argument -c: lists 1 more than"),
        (["gate", "--soak", "1x"], "kvwatch gate: error: argument --soak: --soak takes a duration"),
        ([], "kvwatch: error: the following arguments are required: command"),
    ],
)
def test_usage_errors_exit_2_in_one_line_without_the_usage_block(args, message):
    line = one_line_error(kvwatch(*args), 2)
    assert line.startswith(message), line
    assert "--help" in line


def test_c_given_again_adds_its_concurrencies():
    """``-c 1 -c 8`` runs both, not the last alone (argparse's own default)."""
    from kvwatch.parser import build_parser

    parser = build_parser()
    assert parser.parse_args(["gate", "-c", "1", "-c", "8"]).c == (1, 8)
    assert parser.parse_args(["gate", "-c", "2,4", "-c", "8"]).c == (2, 4, 8)
    assert parser.parse_args(["gate"]).c is None


def test_fault_names_parse_from_env_and_reject_unknown_names():
    assert faults_from_env({ENV_VAR: "root-in-evict-set, interior-snapshot-leak"}) == {
        Fault.ROOT_IN_EVICT_SET,
        Fault.INTERIOR_SNAPSHOT_LEAK,
    }
    assert faults_from_env({}) == frozenset()
    try:
        parse_faults(["root-in-evict-set", "made-up"])
    except ValueError as exc:
        assert "unknown fault 'made-up'" in str(exc) and "root-ref-leak-on-miss" in str(exc)
    else:
        raise AssertionError("an unknown fault name was accepted")


@pytest.mark.e2e
def test_serve_rejects_bad_flags_with_exit_2():
    for args, message in (
        (["--prefix-cache", "tree"], "invalid choice"),
        (["--inject", "no-such-fault"], "unknown fault"),
        (["--probe-token", "t"], "--probe-token needs --enable-probe"),
    ):
        out = kvwatch("serve", *args)
        assert out.returncode == 2 and message in out.stderr, (args, out.stderr)


@pytest.mark.e2e
def test_serve_with_the_slots_backend_and_an_injected_fault():
    import httpx
    from serverproc import kvwatch_server

    with kvwatch_server(
        "--prefix-cache", "slots", "--inject", "stale-slot-entry", "--enable-probe"
    ) as url:
        body = {
            "model": "tiny",
            "messages": [
                {"role": "system", "content": "s" * 40},
                {"role": "user", "content": "hi"},
            ],
            "max_tokens": 2,
        }
        assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300).status_code == 200
        report = httpx.get(f"{url}/debug/probe", timeout=300).json()
        assert report["slots"]["filled"] == 1 and report["slots"]["entries"] == 1
        assert report["findings"] == []


@pytest.mark.e2e
def test_serve_on_a_missing_device_exits_2_with_a_message():
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    out = kvwatch("serve", "--device", "cuda")
    assert out.returncode == 2 and "cannot start the engine" in out.stderr, out.stderr


@pytest.mark.parametrize("port", ["99999", "65536", "-1", "http"])
def test_serve_refuses_a_port_out_of_range_in_one_line(port):
    line = one_line_error(kvwatch("serve", "--port", port), 2)
    assert line.startswith("kvwatch serve: error: argument --port: want a TCP port in 0..65535")
    assert repr(port) in line


@pytest.mark.e2e
def test_serve_on_a_port_in_use_exits_2_in_one_line():
    from kvwatch.sockets import listen_socket

    taken = listen_socket("127.0.0.1", 0)
    taken.listen()
    try:
        port = taken.getsockname()[1]
        out = kvwatch("serve", "--port", str(port))
    finally:
        taken.close()
    line = one_line_error(out, 2)
    assert line.startswith(f"kvwatch serve: cannot listen on 127.0.0.1:{port}: "), line
    assert "in use" in line


def test_gate_engine_vllm_checks_its_flags_before_starting_anything(tmp_path):
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text("{}")
    for args, message in (
        (["--model", str(tmp_path / "none")], "--engine vllm takes --model DIR"),
        (["--model", str(model), "--target", "http://127.0.0.1:1"], "does not take --target"),
        (["--model", str(model), "--inject", "root-in-evict-set"], "injects one fault of"),
        (["--model", str(model), "--soak", "10s"], "--soak does not take --engine"),
    ):
        out = kvwatch("gate", "--engine", "vllm", "--out", str(tmp_path / "out"), *args)
        assert out.returncode == 2 and message in out.stderr, (args, out.stderr)
    out = kvwatch("gate", "--engine", "sglang")
    assert out.returncode == 2 and "invalid choice" in out.stderr


@pytest.mark.e2e
def test_serve_says_where_it_listens_then_that_it_is_ready():
    """With ``--port 0`` the first line names the port the kernel gave; once the
    second says ready, ``/health`` answers 200 there (asked once: no retry hides
    a server that said ready too early)."""
    import httpx

    from kvwatch.processes import stop

    proc = subprocess.Popen(
        [sys.executable, "-m", "kvwatch", "serve", "--port", "0", "--inject", "root-in-evict-set"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, ENV_VAR: ""},  # the one fault asked for, whatever the environment says
    )
    try:
        listening = proc.stderr.readline()
        ready = proc.stderr.readline()
        match = re.fullmatch(r"kvwatch serve: listening on http://127\.0\.0\.1:(\d+)\n", listening)
        assert match and int(match[1]) != 0, listening
        assert ready == (
            "kvwatch serve: ready (kvwatch-tiny-hybrid on cpu, prefix cache radix, "
            "probe endpoints off, faults: root-in-evict-set)\n"
        ), ready
        health = httpx.get(f"http://127.0.0.1:{match[1]}/health", timeout=300)
        assert health.status_code == 200 and health.json() == {"status": "ok"}
    finally:
        stop(proc)  # SIGINT, as Ctrl-C
        rest = proc.stderr.read()
        proc.stderr.close()
    assert proc.returncode == 130 and rest == "", rest  # stopped cleanly, nothing more said


def test_dashboards_build_into_a_file_exits_2_in_one_line(tmp_path):
    taken = tmp_path / "dashboards.json"
    taken.write_text("mine")
    for args in (["--out", str(taken)], ["--out", str(taken), "--check"]):
        line = one_line_error(kvwatch("dashboards", "build", *args), 2)
        assert line == f"kvwatch dashboards build: --out {taken} is a file, not a directory"
    assert taken.read_text() == "mine"


def test_dashboards_build_where_it_cannot_write_exits_2_in_one_line(tmp_path):
    below_a_file = tmp_path / "file" / "json"
    below_a_file.parent.write_text("")
    line = one_line_error(kvwatch("dashboards", "build", "--out", str(below_a_file)), 2)
    assert line.startswith(f"kvwatch dashboards build: cannot write {below_a_file}: "), line


@pytest.mark.parametrize("flag", ["--target", "--metrics-url"])
def test_gate_with_a_target_that_is_not_a_url_is_a_usage_error(flag, tmp_path):
    urls = {"--target": "http://127.0.0.1:9", "--metrics-url": "http://127.0.0.1:9/metrics"}
    urls[flag] = "not-a-url"
    args = [a for pair in urls.items() for a in pair]
    line = one_line_error(kvwatch("gate", "--out", str(tmp_path / "out"), *args), 2)
    assert line == f"kvwatch gate: {flag} takes an http(s) URL, not 'not-a-url'"
    assert not (tmp_path / "out").exists()


def test_gate_with_a_target_where_nothing_listens_exits_3_before_any_load(tmp_path):
    """A socket bound but not listening refuses every connection while it is held,
    so the address is certain to answer nothing."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        target = f"http://127.0.0.1:{closed.getsockname()[1]}"
        out = kvwatch(
            *("gate", "--out", str(tmp_path / "out"), "--profile", "agentic-trie"),
            *("--target", target, "--metrics-url", f"{target}/metrics"),
        )
    line = one_line_error(out, 3)
    assert line == f"kvwatch gate: nothing answers at {target} (--target): Connection refused"
    assert not (tmp_path / "out").exists()  # no run started: nothing written
