"""The CLI contract: `kvwatch faults [--json]` and usage errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

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


def kvwatch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvwatch", *args], capture_output=True, text=True)


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


def test_usage_errors_exit_2():
    assert kvwatch("no-such-command").returncode == 2
    assert kvwatch("faults", "--bogus").returncode == 2


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


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_serve_refuses_a_port_out_of_range_in_one_line(port):
    out = kvwatch("serve", "--port", port)
    assert out.returncode == 2, out.stderr
    assert "want a TCP port in 0..65535" in out.stderr and "Traceback" not in out.stderr


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
    assert out.returncode == 2, out.stderr
    assert f"kvwatch serve: cannot listen on 127.0.0.1:{port}" in out.stderr
    assert "Traceback" not in out.stderr


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

    from kvwatch.loadtests.servers import stop

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
