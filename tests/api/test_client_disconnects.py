"""A client that leaves is a client disconnect: never a 500, never a partial append, always a trace.

On both HTTP adapters (granian, aiohttp), against a live server:

* mid-body (``Content-Length: 10``, one byte sent, connection closed): no
  ERROR line or traceback, nothing in ``tiered_http_requests_total`` (so the
  append-5xx alarm does not see it), one
  ``tiered_http_client_disconnects_total{route="append",phase="request"}``,
  an access-log line with the request's id, the stream unchanged;
* a chunked body cut before its last chunk is never appended (granian's chunk
  iterator reports the cut as an empty chunk, the same as the end: it was
  appended, truncated) and leaves no 5xx;
* an HTTP/2 stream reset mid-body (``RST_STREAM(CANCEL)``, granian) is never
  appended either, while a body ended by an empty ``END_STREAM`` DATA frame
  (how streaming HTTP/2 clients end theirs) is;
* a long-poll reader that leaves before its answer, and an SSE reader that
  leaves mid-stream (``phase="response"``, its 200 counted too), are client
  disconnects, with no ERROR line.

Each step waits for a condition with a deadline (the server's own counters),
never for a fixed time.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable, Iterator

import h2.config
import h2.connection
import h2.errors
import pytest

from tests.support.http_helpers import append, new_stream, read, tail
from tests.support.metrics_helpers import scrape
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.timeout(120)

DISCONNECT = 'tiered_http_client_disconnects_total{phase="%s",route="%s"}'
APPEND_REQUESTS = 'tiered_bucket_requests_total{bucket="default",class="append"}'


@pytest.fixture(scope="module", params=["granian", "aiohttp"])
def srv(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    s = ServerProcess(
        tmp_path_factory.mktemp(f"disconnects-{request.param}") / "data",
        "--http-server",
        request.param,
        "--long-poll-timeout-s",
        "30",
    ).start()
    try:
        yield s
    finally:
        s.stop()


def wait_until(what: str, condition: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def count(srv: ServerProcess, key: str) -> float:
    return scrape(srv).get(key, 0.0)


def server_errors(srv: ServerProcess) -> dict[str, float]:
    """Every 5xx the server counted, by series."""
    return {
        k: v
        for k, v in scrape(srv).items()
        if k.startswith("tiered_http_requests_total") and 'status="5' in k and v
    }


def assert_no_error_lines(srv: ServerProcess) -> None:
    log = srv.log()
    for marker in (" ERROR ", "Traceback", "RSGIProtocolClosed", "internal error"):
        assert marker not in log, f"{marker!r} in the server log:\n{log[-3000:]}"


def access_line(srv: ServerProcess, request_id: str) -> str:
    lines = [
        ln for ln in srv.log().splitlines() if "tiered.access" in ln and f"request_id={request_id}" in ln
    ]
    assert len(lines) == 1, (request_id, lines, srv.log()[-3000:])
    return lines[0]


def send_part_then_close(srv: ServerProcess, head: bytes, part: bytes) -> None:
    """Send a request's head and part of its body, wait until the server admitted it, then leave."""
    before = count(srv, APPEND_REQUESTS)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        sock.sendall(head + part)
        # Admitted (counted in the bucket's usage) means its handler is reading the body now.
        wait_until("the append to be admitted", lambda: count(srv, APPEND_REQUESTS) > before)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST: gone


def test_a_client_that_leaves_mid_body_is_a_disconnect_not_a_500(srv: ServerProcess) -> None:
    u = new_stream(srv, body=b"kept")
    path = u.removeprefix(srv.url)
    key = DISCONNECT % ("request", "append")
    before = count(srv, key)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\n"
        "Content-Length: 10\r\nX-Request-Id: left-mid-body-1\r\n\r\n"
    ).encode()
    send_part_then_close(srv, head, b"x")
    wait_until("the disconnect to be counted", lambda: count(srv, key) == before + 1)
    assert server_errors(srv) == {}
    assert read(u, "-1")[2] == b"kept"
    line = access_line(srv, "left-mid-body-1")
    assert "client disconnected" in line and "route=append" in line and "phase=request" in line, line
    assert "bucket=default" in line and "method=POST" in line, line
    assert_no_error_lines(srv)


def test_a_chunked_body_cut_before_its_end_is_never_appended(srv: ServerProcess) -> None:
    u = new_stream(srv, body=b"kept")
    path = u.removeprefix(srv.url)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\n"
        "Transfer-Encoding: chunked\r\nX-Request-Id: cut-chunked-1\r\n\r\n"
    ).encode()
    send_part_then_close(srv, head, b"5\r\nhello\r\n3\r\nwor")
    # granian: refused (400: the body did not end cleanly), aiohttp: a disconnect. Never a 204.
    wait_until("the request's access-log line", lambda: "request_id=cut-chunked-1" in srv.log())
    line = access_line(srv, "cut-chunked-1")
    assert ("status=400" in line and "code=BAD_REQUEST" in line) or "phase=request" in line, line
    assert read(u, "-1")[2] == b"kept"
    assert server_errors(srv) == {}
    assert_no_error_lines(srv)


def test_a_malformed_chunked_body_is_a_400_and_changes_nothing(srv: ServerProcess) -> None:
    u = new_stream(srv, body=b"kept")
    path = u.removeprefix(srv.url)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\n"
            "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n".encode()
        )
        answer = sock.recv(65536)
    assert answer.split(b"\r\n", 1)[0].split(b" ")[1] == b"400", answer[:300]  # aiohttp answers it itself
    assert read(u, "-1")[2] == b"kept"
    assert server_errors(srv) == {}
    assert_no_error_lines(srv)


def test_a_long_poll_reader_that_leaves_is_a_disconnect(srv: ServerProcess) -> None:
    u = new_stream(srv)
    path = u.removeprefix(srv.url) + f"?offset={tail(u)}&live=long-poll"
    key = DISCONNECT % ("request", "read")
    before = count(srv, key)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-Id: left-poll-1\r\n\r\n".encode())
        wait_until("the reader to wait", lambda: scrape(srv)["tiered_live_readers"] == 1)
    wait_until("the disconnect to be counted", lambda: count(srv, key) == before + 1)
    assert scrape(srv)["tiered_live_readers"] == 0
    assert "phase=request" in access_line(srv, "left-poll-1")
    assert server_errors(srv) == {}
    assert_no_error_lines(srv)


def test_an_sse_reader_that_leaves_mid_stream_is_a_disconnect(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain", b"first")
    path = u.removeprefix(srv.url) + "?offset=-1&live=sse"
    key = DISCONNECT % ("response", "read")
    before, ok_before = count(srv, key), count(srv, 'tiered_http_requests_total{route="read",status="200"}')
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-Id: left-sse-1\r\n\r\n".encode())
        received = b""
        while b"first" not in received:
            chunk = sock.recv(65536)
            assert chunk, received
            received += chunk
        assert received.startswith(b"HTTP/1.1 200")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    # The server notices when it next writes (or when its disconnect watch fires).
    deadline = time.monotonic() + 15
    while count(srv, key) < before + 1:
        assert time.monotonic() < deadline, "the SSE reader's disconnect was never counted"
        append(u, b"more", "text/plain")
        time.sleep(0.05)
    assert count(srv, key) == before + 1
    assert count(srv, 'tiered_http_requests_total{route="read",status="200"}') == ok_before + 1
    assert server_errors(srv) == {}
    assert_no_error_lines(srv)


# --------------------------------------------------------------------------- HTTP/2 (granian)


def _h2_post(srv: ServerProcess, path: str, end: str) -> int | None:
    """POST over cleartext HTTP/2 (prior knowledge), no Content-Length: "hello", then ``end``; the status.

    ``end`` is sent once the server admitted the request (its handler is reading the body).
    """
    before = count(srv, APPEND_REQUESTS)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        conn.initiate_connection()
        sid = conn.get_next_available_stream_id()
        conn.send_headers(
            sid,
            [
                (":method", "POST"),
                (":path", path),
                (":scheme", "http"),
                (":authority", f"127.0.0.1:{srv.port}"),
                ("content-type", "application/octet-stream"),
                ("x-request-id", f"h2-{end}"),
            ],
        )
        conn.send_data(sid, b"hello")
        sock.sendall(conn.data_to_send())
        wait_until("the append to be admitted", lambda: count(srv, APPEND_REQUESTS) > before)
        if end == "reset":
            conn.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
        else:
            conn.send_data(sid, b"", end_stream=True)
        sock.sendall(conn.data_to_send())
        if end == "reset":
            return None
        while True:
            data = sock.recv(65536)
            assert data, "the server closed the connection without an answer"
            for event in conn.receive_data(data):
                if getattr(event, "stream_id", None) == sid and hasattr(event, "headers"):
                    return int(dict(event.headers)[":status"])
            sock.sendall(conn.data_to_send())


def test_an_http2_stream_reset_mid_body_is_never_appended(srv: ServerProcess) -> None:
    if "granian" not in srv.args:
        pytest.skip("HTTP/2 is served by granian only")
    u = new_stream(srv, body=b"kept")
    path = u.removeprefix(srv.url)
    key = DISCONNECT % ("request", "append")
    before = count(srv, key)
    assert _h2_post(srv, path, "reset") is None
    wait_until("the reset to be counted", lambda: count(srv, key) == before + 1)
    assert read(u, "-1")[2] == b"kept"
    # A body ended by an empty END_STREAM frame is whole: appended.
    assert _h2_post(srv, path, "end") == 204
    assert read(u, "-1")[2] == b"kepthello"
    assert server_errors(srv) == {}
    assert_no_error_lines(srv)
