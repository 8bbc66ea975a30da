"""Live reads: long-poll (waiting, timeouts, closure, cursors) and SSE (framing, encoding, closure).

Each test runs on one node and on a single-node cluster (every shard's engine behind
shard routing): the server fixture's deployments (``tests/support/deployments.py``).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator

import pytest

from tests.support import deployments
from tests.support.deadlines import scaled
from tests.support.http_helpers import (
    Background,
    SseEvent,
    SseReader,
    append,
    assert_security_headers,
    close,
    create,
    error_message,
    head,
    new_stream,
    read,
    request,
    stream_url,
    tail,
    unique,
)
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.timeout(60)

LONG_POLL_TIMEOUT = 2.0  # what module_server passes as --long-poll-timeout-s
CACHEABLE = "public, max-age=60, stale-while-revalidate=300"
CHUNK = 3  # --read-chunk-bytes of the chunky server


@pytest.fixture(scope="module", params=deployments.SINGLE_AND_CLUSTER)
def srv(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    yield from deployments.module_server(request, "live")


@pytest.fixture(scope="module", params=deployments.SINGLE_AND_CLUSTER)
def chunky(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """At most CHUNK bytes per read: smaller than some UTF-8 characters."""
    yield from deployments.module_server(request, "live-chunky", "--read-chunk-bytes", str(CHUNK))


def long_poll(u: str, offset: str, cursor: str | None = None) -> tuple[int, object, bytes]:
    params = {"live": "long-poll"}
    if cursor is not None:
        params["cursor"] = cursor
    return read(u, offset, **params)


# ------------------------------------------------------------ long-poll


def test_long_poll_with_data_available_returns_at_once(srv: ServerProcess) -> None:
    u = new_stream(srv, body=b"ready")
    started = time.monotonic()
    status, headers, body = long_poll(u, "-1")
    assert time.monotonic() - started < 1.0
    assert (status, body) == (200, b"ready")
    assert headers["Stream-Up-To-Date"] == "true"
    assert headers["Stream-Next-Offset"] == head(u)[1]["Stream-Next-Offset"]
    assert headers["Stream-Cursor"].isdigit()
    assert headers["Cache-Control"] == CACHEABLE
    assert headers["ETag"]
    assert_security_headers(headers)


def test_long_poll_waits_for_a_concurrent_append(srv: ServerProcess) -> None:
    u = new_stream(srv, body=b"before")
    tail = head(u)[1]["Stream-Next-Offset"]
    waiter = Background(lambda: long_poll(u, tail))
    time.sleep(0.4)
    new_tail = append(u, bytes(range(256)))[1]["Stream-Next-Offset"]
    status, headers, body = waiter.result()
    assert 0.3 < waiter.elapsed < LONG_POLL_TIMEOUT
    assert status == 200
    assert body == bytes(range(256))
    assert headers["Stream-Next-Offset"] == new_tail
    assert headers["Stream-Up-To-Date"] == "true"
    assert headers["Stream-Cursor"].isdigit()


def test_long_poll_offset_now_waits_for_new_data_only(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain", "history")
    waiter = Background(lambda: long_poll(u, "now"))
    time.sleep(0.4)
    append(u, "fresh", "text/plain")
    status, headers, body = waiter.result()
    assert (status, body) == (200, b"fresh")
    assert headers["Content-Type"] == "text/plain"


def test_long_poll_timeout_is_204_with_tail_up_to_date_and_cursor(srv: ServerProcess) -> None:
    u = new_stream(srv, body=b"abc")
    tail = head(u)[1]["Stream-Next-Offset"]
    started = time.monotonic()
    status, headers, body = long_poll(u, tail)
    elapsed = time.monotonic() - started
    assert LONG_POLL_TIMEOUT - 0.2 <= elapsed < LONG_POLL_TIMEOUT + 2
    assert (status, body) == (204, b"")
    assert headers["Stream-Next-Offset"] == tail
    assert headers["Stream-Up-To-Date"] == "true"
    assert headers["Stream-Cursor"].isdigit()
    assert "Stream-Closed" not in headers
    assert_security_headers(headers)


def test_long_poll_on_closed_stream_at_tail_returns_204_immediately(srv: ServerProcess) -> None:
    u = new_stream(srv, body=b"done")
    close(u)
    tail = head(u)[1]["Stream-Next-Offset"]
    for offset in (tail, "now"):
        started = time.monotonic()
        status, headers, body = long_poll(u, offset)
        assert time.monotonic() - started < 1.0
        assert (status, body) == (204, b"")
        assert headers["Stream-Closed"] == "true"
        assert headers["Stream-Up-To-Date"] == "true"
        assert headers["Stream-Next-Offset"] == tail


def test_long_poll_on_closed_stream_before_tail_returns_the_rest(srv: ServerProcess) -> None:
    u = new_stream(srv, body=b"part1")
    append(u, b"part2", Stream_Closed="true")
    status, headers, body = long_poll(u, "-1")
    assert (status, body) == (200, b"part1part2")
    assert headers["Stream-Closed"] == "true"
    assert headers["Stream-Up-To-Date"] == "true"


def test_long_poll_is_woken_by_close(srv: ServerProcess) -> None:
    u = new_stream(srv, body=b"x")
    tail = head(u)[1]["Stream-Next-Offset"]
    waiter = Background(lambda: long_poll(u, tail))
    time.sleep(0.4)
    close(u)
    status, headers, body = waiter.result()
    assert waiter.elapsed < LONG_POLL_TIMEOUT
    assert (status, body) == (204, b"")
    assert headers["Stream-Closed"] == "true"
    assert headers["Stream-Next-Offset"] == tail


def test_long_poll_is_woken_by_delete_with_404(srv: ServerProcess) -> None:
    u = new_stream(srv, body=b"x")
    tail = head(u)[1]["Stream-Next-Offset"]
    waiter = Background(lambda: long_poll(u, tail))
    time.sleep(0.4)
    assert request("DELETE", u)[0] == 204
    status, _, _ = waiter.result()
    assert waiter.elapsed < LONG_POLL_TIMEOUT
    assert status == 404


def test_long_poll_cursor_strictly_increases_when_echoed(srv: ServerProcess) -> None:
    u = new_stream(srv, body=b"data")
    cursor = long_poll(u, "-1")[1]["Stream-Cursor"]
    seen = [int(cursor)]
    for _ in range(4):
        cursor = long_poll(u, "-1", cursor)[1]["Stream-Cursor"]
        assert int(cursor) > seen[-1]
        seen.append(int(cursor))
    # A cursor far in the future still moves forward.
    assert int(long_poll(u, "-1", "99999999999")[1]["Stream-Cursor"]) > 99999999999
    # Junk cursors are ignored rather than rejected.
    status, headers, _ = long_poll(u, "-1", "not-a-number")
    assert status == 200
    assert headers["Stream-Cursor"].isdigit()


def test_long_poll_json_returns_an_array(srv: ServerProcess) -> None:
    u = new_stream(srv, "application/json")
    waiter = Background(lambda: long_poll(u, "now"))
    time.sleep(0.3)
    append(u, '[{"a":1},{"b":"two"}]', "application/json")
    status, headers, body = waiter.result()
    assert status == 200
    assert json.loads(body) == [{"a": 1}, {"b": "two"}]
    assert headers["Content-Type"] == "application/json"


def test_long_poll_errors(srv: ServerProcess) -> None:
    u = new_stream(srv, body=b"x")
    status, _, body = read(u, None, live="long-poll")
    assert status == 400  # live reads need an offset
    assert error_message(body)
    assert long_poll(u, "garbage")[0] == 400
    assert long_poll(stream_url(srv.url, unique("missing")), "-1")[0] == 404


# ------------------------------------------------------------------ SSE


def controls(events: list[SseEvent]) -> list[dict[str, object]]:
    return [e.json() for e in events if e.event == "control"]


def up_to_date(events: list[SseEvent]) -> bool:
    return any(c.get("upToDate") for c in controls(events))


def test_sse_binary_stream_is_base64_with_header(srv: ServerProcess) -> None:
    payload = bytes(range(256)) * 2
    u = new_stream(srv, "application/octet-stream", payload)
    tail = head(u)[1]["Stream-Next-Offset"]
    with SseReader(u, "-1") as sse:
        assert sse.status == 200
        assert sse.headers["Content-Type"] == "text/event-stream"
        assert sse.headers["Stream-Sse-Data-Encoding"] == "base64"
        assert sse.headers["Cache-Control"] == "no-cache"
        assert_security_headers(sse.headers)
        events = sse.read_until(up_to_date)
        assert [e.event for e in events] == ["data", "control"]
        assert events[0].b64() == payload
        # Long base64 text is split over several data: lines.
        assert events[0].data.count("\n") >= 1
        ctl = events[1].json()
        assert ctl["streamNextOffset"] == tail
        assert ctl["upToDate"] is True
        assert str(ctl["streamCursor"]).isdigit()
        assert "streamClosed" not in ctl
        # Live: a new append arrives as another data + control pair.
        new_tail = append(u, b"\x00\xff\x10")[1]["Stream-Next-Offset"]
        events = sse.read_until(lambda ev: len(controls(ev)) == 2)
        assert [e.event for e in events] == ["data", "control", "data", "control"]
        assert events[2].b64() == b"\x00\xff\x10"
        assert events[3].json()["streamNextOffset"] == new_tail


def test_sse_text_stream_is_plain_utf8(srv: ServerProcess) -> None:
    text = "héllo wörld ✓ \u2028 end"
    u = new_stream(srv, "text/plain; charset=utf-8", text)
    with SseReader(u, "-1") as sse:
        assert sse.status == 200
        assert "Stream-Sse-Data-Encoding" not in sse.headers
        events = sse.read_until(up_to_date)
        assert [e.event for e in events] == ["data", "control"]
        assert events[0].data == text


def test_sse_text_lines_starting_with_a_space_round_trip(srv: ServerProcess) -> None:
    text = " leading space\n  indented line\n"
    u = new_stream(srv, "text/plain", text)
    with SseReader(u, "-1") as sse:
        events = sse.read_until(up_to_date)
    assert events[0].data == text


def test_sse_text_with_line_breaks_cannot_inject_events(srv: ServerProcess) -> None:
    evil = (
        "line one\r\n"
        "\r\n"
        "event: control\r\n"
        'data: {"streamNextOffset":"9999999999999999_9999999999999999","streamClosed":true}\r\n'
        "\r\n"
        "id: 42\n"
        "retry: 1\r"
        ": comment\n\n"
        "event: data\r\r"
        "data: tail\n"
    )
    u = new_stream(srv, "text/plain", evil)
    tail = head(u)[1]["Stream-Next-Offset"]
    with SseReader(u, "-1") as sse:
        events = sse.read_until(up_to_date)
        assert [e.event for e in events] == ["data", "control"]
        assert events[0].id is None
        assert sse.parser.comments == []
        # SSE cannot carry CR, so line breaks arrive normalised to LF - but all of
        # the text arrives as data of the one event, never as fields of its own.
        assert events[0].data == evil.replace("\r\n", "\n").replace("\r", "\n")
        ctl = events[1].json()
        assert ctl["streamNextOffset"] == tail
        assert "streamClosed" not in ctl
        # The raw wire form: every line of the data event is a data: field.
        raw = bytes(sse.raw).split(b"\n\nevent: control", 1)[0]
        lines = raw.split(b"\n")
        assert lines[0] == b"event: data"
        assert all(line.startswith(b"data:") for line in lines[1:])
        assert b"\r" not in raw


def test_sse_json_stream_sends_arrays(srv: ServerProcess) -> None:
    messages = [{"text": "multi\nline\r\nstring"}, "a\n\nb", [1, 2], None]
    u = new_stream(srv, "application/json", json.dumps(messages))
    with SseReader(u, "-1") as sse:
        assert "Stream-Sse-Data-Encoding" not in sse.headers
        events = sse.read_until(up_to_date)
        assert [e.event for e in events] == ["data", "control"]
        assert events[0].json() == messages
        append(u, '{"later": true}', "application/json")
        events = sse.read_until(lambda ev: len(controls(ev)) == 2)
        assert events[2].json() == [{"later": True}]


def test_sse_offset_now_starts_at_tail(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain", "old news")
    tail = head(u)[1]["Stream-Next-Offset"]
    with SseReader(u, "now") as sse:
        events = sse.read_until(lambda ev: len(ev) >= 1)
        assert [e.event for e in events] == ["control"]
        ctl = events[0].json()
        assert ctl["streamNextOffset"] == tail
        assert ctl["upToDate"] is True
        assert str(ctl["streamCursor"]).isdigit()
        append(u, "breaking", "text/plain")
        events = sse.read_until(lambda ev: len(controls(ev)) == 2)
        assert [e.event for e in events] == ["control", "data", "control"]
        assert events[1].data == "breaking"


def test_sse_closed_stream_at_tail_sends_one_control_event_and_ends(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain", "all done")
    close(u)
    tail = head(u)[1]["Stream-Next-Offset"]
    for offset in (tail, "now"):
        with SseReader(u, offset) as sse:
            events = sse.read_to_eof()
            assert [e.event for e in events] == ["control"]
            ctl = events[0].json()
            assert ctl["streamNextOffset"] == tail
            assert ctl["streamClosed"] is True
            assert ctl["upToDate"] is True
            assert "streamCursor" not in ctl


def test_sse_closed_stream_from_start_sends_data_then_closes(srv: ServerProcess) -> None:
    u = new_stream(srv, "application/octet-stream", b"\x01\x02\x03")
    close(u)
    with SseReader(u, "-1") as sse:
        events = sse.read_to_eof()
        assert [e.event for e in events] == ["data", "control"]
        assert events[0].b64() == b"\x01\x02\x03"
        ctl = events[1].json()
        assert ctl["streamClosed"] is True
        assert "streamCursor" not in ctl


def test_sse_connection_ends_when_the_stream_is_closed_live(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain", "start")
    with SseReader(u, "-1") as sse:
        sse.read_until(up_to_date)
        append(u, "-end", "text/plain", Stream_Closed="true")
        events = sse.read_to_eof()
        assert [e.event for e in events] == ["data", "control", "data", "control"]
        assert events[2].data == "-end"
        last = events[3].json()
        assert last["streamClosed"] is True
        assert last["streamNextOffset"] == head(u)[1]["Stream-Next-Offset"]


def test_sse_close_only_while_connected(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain", "x")
    with SseReader(u, "-1") as sse:
        sse.read_until(up_to_date)
        close(u)
        events = sse.read_to_eof()
        assert [e.event for e in events] == ["data", "control", "control"]
        assert events[2].json()["streamClosed"] is True


def test_sse_cursor_moves_past_an_echoed_cursor(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain", "x")
    with SseReader(u, "-1") as sse:
        first = int(controls(sse.read_until(up_to_date))[0]["streamCursor"])
    with SseReader(u, "-1", cursor=str(first)) as sse:
        second = int(controls(sse.read_until(up_to_date))[0]["streamCursor"])
    assert second > first


def test_sse_errors(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain", "x")
    status, headers, body = read(u, None, live="sse")
    assert status == 400
    assert headers["Content-Type"] == "application/json"
    assert read(u, "bogus", live="sse")[0] == 400
    assert read(stream_url(srv.url, unique("missing")), "-1", live="sse")[0] == 404


def test_sse_binary_chunks_decode_separately(chunky: ServerProcess) -> None:
    payload = bytes(range(23))
    u = new_stream(chunky, "application/octet-stream", payload)
    with SseReader(u, "-1") as sse:
        events = sse.read_until(up_to_date)
    data = [e for e in events if e.event == "data"]
    ctls = controls(events)
    assert len(data) == len(ctls) == -(-len(payload) // CHUNK)
    assert b"".join(e.b64() for e in data) == payload
    assert all("upToDate" not in c for c in ctls[:-1])
    assert all(str(c["streamCursor"]).isdigit() for c in ctls)  # open stream: always a cursor
    assert ctls[-1]["upToDate"] is True
    offsets = [c["streamNextOffset"] for c in ctls]
    assert offsets == sorted(offsets)


def test_sse_text_chunks_do_not_split_utf8_characters(chunky: ServerProcess) -> None:
    text = "aéééb"  # chunks of 3 bytes would cut every other é in half
    u = new_stream(chunky, "text/plain; charset=utf-8", text)
    with SseReader(u, "-1") as sse:
        events = sse.read_until(up_to_date)
    assert "".join(e.data for e in events if e.event == "data") == text


def test_sse_base64_of_every_byte_value_is_standard_alphabet(srv: ServerProcess) -> None:
    payload = bytes(range(256))
    u = new_stream(srv, "application/x-custom", payload)
    with SseReader(u, "-1") as sse:
        events = sse.read_until(up_to_date)
    text = events[0].data.replace("\n", "")
    assert text == base64.b64encode(payload).decode()


def test_sse_connection_is_recycled_without_claiming_eof(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Servers close SSE connections periodically; the client resumes from the last control offset."""
    srv = ServerProcess(tmp_path_factory.mktemp("sse-short") / "data", "--sse-max-connection-s", "1").start()
    try:
        u = new_stream(srv, "text/plain", "first")
        with SseReader(u, "-1") as sse:
            assert sse.read_to_eof(timeout=5)
            last = sse.controls()[-1]
            assert "streamClosed" not in last
            assert last["upToDate"] is True
        append(u, "second", "text/plain")
        with SseReader(u, str(last["streamNextOffset"])) as sse:
            events = sse.read_until(up_to_date)
            assert [e.event for e in events] == ["data", "control"]
            assert events[0].data == "second"
    finally:
        srv.stop()


def test_sse_json_chunks_are_whole_arrays(chunky: ServerProcess) -> None:
    messages = [{"id": i, "pad": "x" * (i % 3)} for i in range(8)]
    u = new_stream(chunky, "application/json", json.dumps(messages))
    with SseReader(u, "-1") as sse:
        events = sse.read_until(up_to_date)
    got: list[object] = []
    for e in events:
        if e.event == "data":
            part = e.json()
            assert isinstance(part, list) and part
            got.extend(part)
    assert got == messages


@pytest.mark.parametrize(
    ("content_type", "encoded"),
    [
        ("text/plain", False),
        ("TEXT/HTML; charset=utf-8", False),
        ("text/csv", False),
        ("application/json", False),
        ("application/json; charset=utf-8", False),
        ("application/octet-stream", True),
        ("application/ndjson", True),
        ("application/x-protobuf", True),
        ("image/svg+xml", True),
    ],
)
def test_sse_encoding_follows_the_content_type(srv: ServerProcess, content_type: str, encoded: bool) -> None:
    body = "[1]" if "json" in content_type and "nd" not in content_type else "abc"
    u = new_stream(srv, content_type, body)
    with SseReader(u, "-1") as sse:
        assert sse.status == 200
        assert sse.headers["Content-Type"] == "text/event-stream"
        assert sse.headers.get("Stream-Sse-Data-Encoding") == ("base64" if encoded else None)
        events = sse.read_until(up_to_date)
    data = events[0]
    assert (data.b64().decode() if encoded else data.data) == body


def test_sse_text_chunks_do_not_split_crlf(chunky: ServerProcess) -> None:
    text = "ab\r\nefgh"  # the chunking server cuts after 3 bytes: between \r and \n
    u = new_stream(chunky, "text/plain", text)
    with SseReader(u, "-1") as sse:
        events = sse.read_until(up_to_date)
    assert "".join(e.data for e in events if e.event == "data") == "ab\nefgh"


def test_sse_text_never_splits_a_character_even_with_tiny_chunks(chunky: ServerProcess) -> None:
    u = new_stream(chunky, "text/plain; charset=utf-8", "😀😀")  # 4-byte characters, 3-byte chunks
    with SseReader(u, "-1") as sse:
        events = sse.read_until(up_to_date)
    assert "".join(e.data for e in events if e.event == "data") == "😀😀"


# --------------------------------------------------------------- waiter slots


def _live_readers(srv: ServerProcess) -> int:
    for line in request("GET", srv.url + "/metrics")[2].decode().splitlines():
        if line.startswith("tiered_live_readers "):
            return int(float(line.split()[1]))
    raise AssertionError("tiered_live_readers missing")


def _open_and_drop(srv: ServerProcess, path: str) -> None:
    """Send a live request and close the connection without reading the answer."""
    import socket

    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    time.sleep(0.2)  # parked on the server
    sock.close()


def test_readers_that_disconnect_free_their_waiter_slot_at_once(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    srv = ServerProcess(
        tmp_path_factory.mktemp("slots") / "data",
        "--max-waiters",
        "2",
        "--long-poll-timeout-s",
        "20",
        "--sse-max-connection-s",
        "60",
    ).start()
    try:
        url = stream_url(srv.url, "slots")
        assert create(url)[0] == 201
        tail_offset = tail(url)
        path = f"/v1/stream/slots?offset={tail_offset}"
        for round_ in range(3):  # more clients than slots come and go, each leaving at once
            _open_and_drop(srv, path + "&live=long-poll")
            _open_and_drop(srv, path + "&live=sse")
            deadline = time.monotonic() + scaled(1.0)
            while _live_readers(srv) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert _live_readers(srv) == 0, f"round {round_}: slots still held by readers that left"
        # Both slots are free: two readers park, a third is refused.
        waiting = [Background(lambda: read(url, tail_offset, live="long-poll")) for _ in range(2)]
        deadline = time.monotonic() + scaled(5)
        while _live_readers(srv) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert read(url, tail_offset, live="long-poll")[0] == 503
        assert append(url, b"x")[0] == 204
        assert [w.result()[0] for w in waiting] == [200, 200]
    finally:
        srv.stop()
