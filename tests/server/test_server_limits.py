"""``kvwatch serve`` binds loopback by default and refuses oversized request heads.

Header blocks up to four times ``--max-header-bytes`` reach the app, which
answers a JSON 431; uvicorn refuses anything larger with a plain 400 before
buffering more. Either way the server lives on.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import httpx
import pytest
from inprocserver import serving
from serverproc import kvwatch_server

from kvwatch.cli import build_parser, main
from kvwatch.serve import ServeOptions, build, uvicorn_options
from kvwatch.server import ServerSettings
from kvwatch.server.uvicorn_settings import HEAD_BUFFER_FACTOR

OK_CHAT = {"model": "t", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def server():
    with kvwatch_server() as url:  # no --host: the default
        yield url


def outward_address() -> str | None:
    """This machine's address on its default route, if it has one that is not loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


@pytest.mark.e2e
def test_the_default_bind_is_loopback(server):
    assert build_parser().parse_args(["serve"]).host == "127.0.0.1"
    assert uvicorn_options(ServeOptions())["host"] == "127.0.0.1"
    port = int(server.rsplit(":", 1)[1])
    address = outward_address()
    if address is None:
        pytest.skip("no non-loopback address to try the port on")
    with pytest.raises(OSError), socket.create_connection((address, port), timeout=2):
        pass


def test_uvicorn_bounds_the_request_head():
    options = ServeOptions(settings=ServerSettings(max_header_bytes=8192))
    got = uvicorn_options(options)
    assert got["http"] == "h11"
    assert got["h11_max_incomplete_event_size"] == HEAD_BUFFER_FACTOR * 8192


@pytest.mark.parametrize(
    "headers",
    [{"x-padding": "a" * 20_000}, {f"x-h{i}": "v" * 24 for i in range(1000)}],
    ids=["one large header", "a thousand small ones"],
)
@pytest.mark.e2e
def test_large_headers_get_a_json_431(server, headers):
    r = httpx.post(f"{server}/v1/chat/completions", json=OK_CHAT, headers=headers, timeout=300)
    assert r.status_code == 431, r.text
    assert r.json()["error"]["code"] == "headers_too_large"
    assert httpx.post(f"{server}/v1/chat/completions", json=OK_CHAT, timeout=300).status_code == 200


@pytest.mark.e2e
def test_a_100_kb_header_is_refused_and_the_server_lives_on(server):
    r = httpx.get(f"{server}/health", headers={"x-padding": "a" * 100_000}, timeout=300)
    assert r.status_code in (400, 431), r.text
    assert httpx.get(f"{server}/health", timeout=300).status_code == 200
    assert httpx.post(f"{server}/v1/chat/completions", json=OK_CHAT, timeout=300).status_code == 200


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-header-bytes", "10"], "max_header_bytes must be >= 1024"),
        (["--session-idle-timeout", "0"], "session_idle_timeout_s must be > 0"),
        (["--session-idle-timeout", "nan"], "session_idle_timeout_s must be > 0"),
    ],
)
def test_bad_limits_are_usage_errors(flags, message, capsys):
    assert main(["serve", *flags]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_over_the_limit_sent_whole_by_urllib_reads_the_413(chunked):
    """urllib sends its whole body before it reads an answer: the server drains
    the body it refuses, so the client reads the 413 instead of a reset."""
    app, _, telemetry = build(ServeOptions(settings=ServerSettings(max_body_bytes=1024 * 1024)))
    body = b"x" * (5 * 1024 * 1024 + 17)
    data = iter([body[: len(body) // 2], body[len(body) // 2 :]]) if chunked else body
    headers = {"Content-Type": "application/json"}
    try:
        with serving(app) as url:
            request = urllib.request.Request(
                url=f"{url}/v1/chat/completions", data=data, headers=headers, method="POST"
            )
            with pytest.raises(urllib.error.HTTPError) as answer:
                urllib.request.urlopen(request, timeout=120)
    finally:
        telemetry.shutdown()
    assert answer.value.code == 413
    assert json.loads(answer.value.read())["error"]["code"] == "body_too_large"
