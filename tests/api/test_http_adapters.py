"""Both HTTP server adapters (granian, the default, and aiohttp) behave the same on the wire.

The rest of the suite runs on the default adapter; this file runs what each
adapter does itself (body limits, chunked bodies, disconnects, shutdown with
live readers, HEAD, preflight, 405) on both, so ``--http-server aiohttp``
stays a working fallback.
"""

from __future__ import annotations

import http.client
import json
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.deadlines import scaled
from tests.support.http_helpers import Background, SseReader, append, create, read, request, stream_url, tail
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.timeout(120)
LIMIT = 2_000_000


@pytest.fixture(scope="module", params=["granian", "aiohttp"])
def srv(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    s = ServerProcess(
        tmp_path_factory.mktemp(f"adapter-{request.param}") / "data",
        "--http-server",
        request.param,
        "--max-body-bytes",
        str(LIMIT),
        # Bodies through the journal only: its limit is what these tests are about (bodies stored by
        # reference, above large_body_threshold_bytes, are tests/api/test_http_large_bodies.py's).
        "--large-body-threshold-bytes",
        "0",
        "--segment-bytes",
        str(4 * LIMIT),
        "--max-waiters",
        "2",
        "--long-poll-timeout-s",
        "20",
    ).start()
    try:
        yield s
    finally:
        s.stop()


def _post_raw(srv: ServerProcess, path: str, body: bytes, *, chunked: bool) -> tuple[int, bytes]:
    """POST a body while the server may already have answered; returns (status, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    try:
        conn.putrequest("POST", path)
        conn.putheader("Content-Type", "application/octet-stream")
        if chunked:
            conn.putheader("Transfer-Encoding", "chunked")
        else:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders()
        piece = 256 * 1024
        for i in range(0, len(body), piece):
            part = body[i : i + piece]
            conn.send(f"{len(part):x}\r\n".encode() + part + b"\r\n" if chunked else part)
        if chunked:
            conn.send(b"0\r\n\r\n")
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_over_the_limit_is_a_413_the_sender_sees_and_changes_nothing(
    srv: ServerProcess, chunked: bool
) -> None:
    u = stream_url(srv.url, f"big-{chunked}")
    assert create(u, "application/octet-stream", b"before")[0] == 201
    path = u.removeprefix(srv.url)
    status, body = _post_raw(srv, path, bytes(5 * LIMIT), chunked=chunked)
    assert status == 413, body[:200]
    assert json.loads(body)["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert read(u)[2] == b"before"
    # Exactly the limit is accepted, byte-exact.
    exact = bytes(range(256)) * (LIMIT // 256) + b"x" * (LIMIT % 256)
    assert _post_raw(srv, path, exact, chunked=chunked)[0] == 204
    assert read(u)[2] == b"before" + exact


def test_head_preflight_and_method_not_allowed(srv: ServerProcess) -> None:
    u = stream_url(srv.url, "misc")
    assert create(u, "text/plain", "abc")[0] == 201
    status, headers, body = request("HEAD", u)
    assert (status, body) == (200, b"") and headers["Stream-Next-Offset"]
    status, headers, _ = request(
        "OPTIONS", u, {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    )
    assert status == 204 and "POST" in headers["Access-Control-Allow-Methods"]
    status, headers, body = request("PATCH", srv.url + "/v1/buckets")
    assert status == 405 and "GET" in headers["Allow"]
    assert json.loads(body)["error"]["code"] == "METHOD_NOT_ALLOWED"
    assert headers["X-Content-Type-Options"] == "nosniff"


def _live_readers(srv: ServerProcess) -> int:
    for line in request("GET", srv.url + "/metrics")[2].decode().splitlines():
        if line.startswith("tiered_live_readers "):
            return int(float(line.split()[1]))
    raise AssertionError("tiered_live_readers missing")


def test_a_reader_that_disconnects_frees_its_slot(srv: ServerProcess) -> None:
    u = stream_url(srv.url, "slots")
    assert create(u)[0] == 201
    offset = tail(u)
    path = u.removeprefix(srv.url) + f"?offset={offset}"
    for live in ("long-poll", "sse", "long-poll"):
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as sock:
            sock.sendall(f"GET {path}&live={live} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            deadline = time.monotonic() + scaled(5)
            while _live_readers(srv) == 0 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert _live_readers(srv) == 1
        deadline = time.monotonic() + scaled(5)
        while _live_readers(srv) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _live_readers(srv) == 0, f"{live}: the slot is still held by a reader that left"
    waiting = [Background(lambda: read(u, offset, live="long-poll")) for _ in range(2)]
    deadline = time.monotonic() + scaled(5)
    while _live_readers(srv) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert read(u, offset, live="long-poll")[0] == 503  # both slots taken
    assert append(u, b"wake")[0] == 204
    assert [w.result()[:3:2] for w in waiting] == [(200, b"wake")] * 2


@pytest.mark.parametrize("adapter", ["granian", "aiohttp"])
def test_sigterm_with_live_readers_ends_them_and_exits_cleanly(tmp_path: Path, adapter: str) -> None:
    srv = ServerProcess(tmp_path / "data", "--http-server", adapter, "--long-poll-timeout-s", "20").start()
    try:
        u = stream_url(srv.url, "watched")
        assert create(u, "text/plain", "x")[0] == 201
        sse = SseReader(u, "-1")
        poll = Background(lambda: read(u, tail(u), live="long-poll"))
        sse.read_until(lambda ev: len(ev) >= 2)
        time.sleep(0.2)
        assert srv.proc is not None
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(10) == 0
        sse.read_to_eof(timeout=5)
        assert poll.result(timeout=5)[0] in (200, 204)
        sse.close()
    finally:
        srv.kill()


def test_granian_paths_come_back_percent_encoded_and_lossy_ones_are_refused() -> None:
    from urllib.parse import unquote

    from tiered.api.kit.rsgi_server import raw_path

    # granian hands over decoded paths; the router and routes expect encoded ones.
    for name in ("plain/path", "a%41b", "100%", "caf\u00e9", "sp ace", "%2F"):
        assert unquote(raw_path(f"/v1/stream/{name}"), errors="strict") == f"/v1/stream/{name}"
    # Invalid UTF-8 arrives as U+FFFD: it must not alias onto a real name.
    with pytest.raises(UnicodeDecodeError):
        unquote(raw_path("/v1/stream/abc\ufffd"), errors="strict")


@pytest.mark.parametrize("adapter", ["granian", "aiohttp"])
def test_percent_signs_and_non_ascii_names_round_trip(tmp_path: Path, adapter: str) -> None:
    srv = ServerProcess(tmp_path / "data", "--http-server", adapter).start()
    try:
        for encoded, name in (("a%2541", "a%41"), ("caf%C3%A9", "caf\u00e9"), ("x%20y", "x y")):
            u = stream_url(srv.url, encoded)
            assert create(u, "text/plain", name)[0] == 201, encoded
            assert read(u)[2] == name.encode()
        # a%41 and aA are different streams
        assert read(stream_url(srv.url, "aA"))[0] == 404
        assert read(stream_url(srv.url, "abc%FF"))[0] == 400
    finally:
        srv.stop()


@pytest.mark.parametrize("adapter", ["granian", "aiohttp"])
@pytest.mark.parametrize("host", [b"ex\xffample", b"evil.example/\x01", b"a b"])
def test_an_unsound_host_header_gives_a_relative_location_not_a_500(
    tmp_path: Path, adapter: str, host: bytes
) -> None:
    srv = ServerProcess(tmp_path / "data", "--http-server", adapter).start()
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as sock:
            sock.sendall(
                b"PUT /v1/stream/hosty HTTP/1.1\r\nHost: " + host + b"\r\nContent-Type: text/plain\r\n"
                b"Content-Length: 0\r\nConnection: close\r\n\r\n"
            )
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
        head_, _, _ = answer.partition(b"\r\n\r\n")
        status = int(head_.split(b" ", 2)[1])
        assert status in (201, 400), answer[:300]  # a server may refuse the Host outright
        if status == 201:
            location = [
                line.split(b":", 1)[1].strip()
                for line in head_.split(b"\r\n")
                if line.lower().startswith(b"location:")
            ]
            assert location == [b"/v1/stream/hosty"], head_
    finally:
        srv.stop()
    assert "Traceback" not in srv.log()
