"""Catch-up reads, HEAD and DELETE: byte-exact bodies, offsets, ETags, caching, chunking.

Each test runs on one node and on a single-node cluster (every shard's engine behind
shard routing): the server fixture's deployments (``tests/support/deployments.py``).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator

import pytest

from tests.support import deployments
from tests.support.deadlines import scaled
from tests.support.http_helpers import (
    append,
    assert_security_headers,
    close,
    create,
    error_message,
    head,
    new_stream,
    read,
    read_all,
    request,
    stream_url,
    unique,
)
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.timeout(60)

CACHEABLE = "public, max-age=60, stale-while-revalidate=300"
ALL_BYTES = bytes(range(256))
CHUNK = 7  # --read-chunk-bytes of the chunking server


@pytest.fixture(scope="module", params=deployments.SINGLE_AND_CLUSTER)
def srv(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    yield from deployments.module_server(request, "read")


@pytest.fixture(scope="module", params=deployments.SINGLE_AND_CLUSTER)
def chunky(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """A server that returns at most CHUNK bytes per catch-up read."""
    yield from deployments.module_server(request, "read-chunky", "--read-chunk-bytes", str(CHUNK))


# ------------------------------------------------------------- catch-up


def test_all_byte_values_round_trip_exactly(srv: ServerProcess) -> None:
    u = new_stream(srv)
    payload = ALL_BYTES + ALL_BYTES[::-1] + b"\r\n\r\n\x00\x00"
    append(u, payload)
    for offset in (None, "-1"):
        status, headers, body = read(u, offset)
        assert status == 200
        assert body == payload
        assert headers["Content-Type"] == "application/octet-stream"
        assert headers["Stream-Up-To-Date"] == "true"
        assert headers["Stream-Next-Offset"] == head(u)[1]["Stream-Next-Offset"]
        assert "Stream-Closed" not in headers
        assert_security_headers(headers)


def test_read_from_each_returned_offset(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain")
    parts = [b"alpha ", b"beta ", b"gamma"]
    offsets = [head(u)[1]["Stream-Next-Offset"]]
    for p in parts:
        offsets.append(append(u, p, "text/plain")[1]["Stream-Next-Offset"])
    for i, off in enumerate(offsets):
        status, headers, body = read(u, off)
        assert status == 200
        assert body == b"".join(parts[i:])
        assert headers["Stream-Next-Offset"] == offsets[-1]
        assert headers["Stream-Up-To-Date"] == "true"
        assert headers["Content-Type"] == "text/plain"


def test_read_at_tail_is_empty_and_up_to_date(srv: ServerProcess) -> None:
    u = new_stream(srv, body=b"abc")
    tail = head(u)[1]["Stream-Next-Offset"]
    status, headers, body = read(u, tail)
    assert (status, body) == (200, b"")
    assert headers["Stream-Next-Offset"] == tail
    assert headers["Stream-Up-To-Date"] == "true"
    assert "Stream-Closed" not in headers


def test_offset_now_skips_existing_data(srv: ServerProcess) -> None:
    u = new_stream(srv, body=b"old")
    tail = head(u)[1]["Stream-Next-Offset"]
    status, headers, body = read(u, "now")
    assert (status, body) == (200, b"")
    assert headers["Stream-Next-Offset"] == tail
    assert headers["Stream-Up-To-Date"] == "true"
    assert headers["Cache-Control"] == "no-store"
    assert "ETag" not in headers
    append(u, b"new")
    assert read(u, tail)[2] == b"new"


@pytest.mark.parametrize(
    "offset",
    [
        "abc",
        "0",
        "-2",
        "",
        "NOW",
        "0000000000000000_000000000000000",
        "0000000000000000_00000000000000000",
        "0000000000000000-0000000000000000",
        "000000000000000a_0000000000000000",
        " 0000000000000000_0000000000000000",
    ],
)
def test_malformed_offset_is_400(srv: ServerProcess, offset: str) -> None:
    u = new_stream(srv, body=b"abc")
    status, headers, body = read(u, offset)
    assert status == 400
    assert error_message(body)
    assert headers["Content-Type"] == "application/json"
    assert_security_headers(headers)


def test_offset_beyond_tail_is_400(srv: ServerProcess) -> None:
    u = new_stream(srv, body=b"abc")
    tail = head(u)[1]["Stream-Next-Offset"]
    other = new_stream(srv, body=b"abcdef")
    further = head(other)[1]["Stream-Next-Offset"]
    assert further > tail
    status, _, body = read(u, further)
    assert status == 400
    assert error_message(body)


def test_read_missing_stream_is_404(srv: ServerProcess) -> None:
    status, headers, body = read(stream_url(srv.url, unique("missing")), "-1")
    assert status == 404
    assert error_message(body)
    assert_security_headers(headers)


def test_catch_up_reads_are_cacheable(srv: ServerProcess) -> None:
    u = new_stream(srv, body=b"abc")
    assert read(u)[1]["Cache-Control"] == CACHEABLE
    assert read(u, head(u)[1]["Stream-Next-Offset"])[1]["Cache-Control"] == CACHEABLE


# ---------------------------------------------------------------- ETags


def test_etag_and_if_none_match(srv: ServerProcess) -> None:
    u = new_stream(srv, body=b"abc")
    _, h1, _ = read(u, "-1")
    etag = h1["ETag"]
    assert etag
    assert read(u, "-1")[1]["ETag"] == etag  # stable for the same range
    status, headers, body = read(u, "-1", {"If-None-Match": etag})
    assert status == 304
    assert body == b""
    assert headers["Stream-Next-Offset"] == h1["Stream-Next-Offset"]
    assert_security_headers(headers)
    # A different validator gets the full body.
    status, _, body = read(u, "-1", {"If-None-Match": '"something-else"'})
    assert (status, body) == (200, b"abc")
    # New data changes the range, so the old ETag no longer matches.
    append(u, b"def")
    status, headers, body = read(u, "-1", {"If-None-Match": etag})
    assert (status, body) == (200, b"abcdef")
    assert headers["ETag"] != etag


def test_etag_differs_by_start_offset(srv: ServerProcess) -> None:
    u = new_stream(srv, body=b"abc")
    mid = append(u, b"def")[1]["Stream-Next-Offset"]
    append(u, b"ghi")
    first = read(u, "-1")[1]["ETag"]
    second = read(u, mid)[1]["ETag"]
    assert first != second


def test_etag_changes_when_the_stream_closes(srv: ServerProcess) -> None:
    u = new_stream(srv, body=b"abc")
    tail = head(u)[1]["Stream-Next-Offset"]
    etag_full = read(u, "-1")[1]["ETag"]
    etag_tail = read(u, tail)[1]["ETag"]
    close(u)
    # Same bytes, but the 304 would hide the closure: must be a 200 with Stream-Closed.
    for offset, old, body_expected in (("-1", etag_full, b"abc"), (tail, etag_tail, b"")):
        status, headers, body = read(u, offset, {"If-None-Match": old})
        assert status == 200
        assert body == body_expected
        assert headers["Stream-Closed"] == "true"
        assert headers["ETag"] != old
        # The new ETag is stable again.
        assert read(u, offset, {"If-None-Match": headers["ETag"]})[0] == 304


def test_etag_differs_for_a_recreated_stream(srv: ServerProcess) -> None:
    u = new_stream(srv, body=b"same")
    etag = read(u)[1]["ETag"]
    request("DELETE", u)
    create(u, "application/octet-stream", b"same")
    status, headers, body = read(u, "-1", {"If-None-Match": etag})
    assert (status, body) == (200, b"same")
    assert headers["ETag"] != etag


# --------------------------------------------------------------- closed


def test_closed_stream_reads(srv: ServerProcess) -> None:
    u = new_stream(srv, body=b"final")
    close(u)
    tail = head(u)[1]["Stream-Next-Offset"]
    status, headers, body = read(u, "-1")
    assert body == b"final"
    assert headers["Stream-Closed"] == "true"
    assert headers["Stream-Up-To-Date"] == "true"
    # The canonical EOF: empty body at the final offset, with Stream-Closed.
    status, headers, body = read(u, tail)
    assert (status, body) == (200, b"")
    assert headers["Stream-Closed"] == "true"
    assert headers["Stream-Next-Offset"] == tail
    # offset=now on a closed stream reports the closure immediately.
    status, headers, body = read(u, "now")
    assert (status, body) == (200, b"")
    assert headers["Stream-Closed"] == "true"
    assert headers["Stream-Up-To-Date"] == "true"
    assert headers["Stream-Next-Offset"] == tail


# ------------------------------------------------------------ chunking


def test_chunked_reads_reassemble_exactly(chunky: ServerProcess) -> None:
    u = new_stream(chunky, body=ALL_BYTES)
    data, responses = read_all(u)
    assert data == ALL_BYTES
    assert len(responses) == -(-len(ALL_BYTES) // CHUNK)
    for _, headers, body in responses[:-1]:
        assert len(body) == CHUNK
        assert "Stream-Up-To-Date" not in headers
        assert "Stream-Closed" not in headers
    assert responses[-1][1]["Stream-Up-To-Date"] == "true"
    offsets = [h["Stream-Next-Offset"] for _, h, _ in responses]
    assert offsets == sorted(offsets)
    assert offsets[-1] == head(u)[1]["Stream-Next-Offset"]


def test_chunked_reads_of_a_closed_stream_signal_closure_only_at_the_end(chunky: ServerProcess) -> None:
    u = new_stream(chunky, body=b"0123456789abcdefghij")
    close(u)
    data, responses = read_all(u)
    assert data == b"0123456789abcdefghij"
    assert all("Stream-Closed" not in h for _, h, _ in responses[:-1])
    assert responses[-1][1]["Stream-Closed"] == "true"


def test_partial_chunks_have_stable_etags(chunky: ServerProcess) -> None:
    u = new_stream(chunky, body=b"0123456789abcdefghij")
    _, headers, body = read(u, "-1")
    assert body == b"0123456"
    assert read(u, "-1", {"If-None-Match": headers["ETag"]})[0] == 304
    append(u, b"more")
    # The first chunk's bytes did not change, so neither did its validator.
    assert read(u, "-1", {"If-None-Match": headers["ETag"]})[0] == 304


def test_json_chunks_hold_whole_messages(chunky: ServerProcess) -> None:
    messages = [{"k": "a long message that exceeds a chunk"}, 1, 2, 3, "x\ny", [4, 5], None]
    u = new_stream(chunky, "application/json", json.dumps(messages).encode())
    got: list[object] = []
    offset = "-1"
    for _ in range(100):
        status, headers, body = read(u, offset)
        assert status == 200
        part = json.loads(body)  # every chunk is a complete JSON array
        assert isinstance(part, list)
        got.extend(part)
        offset = headers["Stream-Next-Offset"]
        if headers.get("Stream-Up-To-Date") == "true":
            break
        assert part, "a partial chunk must make progress"
    assert got == messages


# ------------------------------------------------------------------ HEAD


def test_head_reports_metadata_without_a_body(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain", b"hello")
    status, headers, body = head(u)
    assert (status, body) == (200, b"")
    assert headers["Content-Type"] == "text/plain"
    assert headers["Stream-Next-Offset"] == read(u)[1]["Stream-Next-Offset"]
    assert headers["Cache-Control"] == "no-store"
    assert "Stream-Closed" not in headers
    assert "Stream-TTL" not in headers
    assert "Stream-Expires-At" not in headers
    assert "ETag" not in headers
    assert_security_headers(headers)


def test_head_reports_ttl_expiry_and_closure(srv: ServerProcess) -> None:
    u1 = stream_url(srv.url, unique("head"))
    create(u1, "text/plain", Stream_TTL="600")
    assert head(u1)[1]["Stream-TTL"] == "600"
    u2 = stream_url(srv.url, unique("head"))
    create(u2, "text/plain", Stream_Expires_At="2999-12-31T23:59:59Z")
    assert head(u2)[1]["Stream-Expires-At"] == "2999-12-31T23:59:59Z"
    close(u2)
    h = head(u2)[1]
    assert h["Stream-Closed"] == "true"
    assert h["Cache-Control"] == "no-store"


def test_head_missing_is_404_without_body(srv: ServerProcess) -> None:
    status, headers, body = head(stream_url(srv.url, unique("missing")))
    assert (status, body) == (404, b"")
    assert_security_headers(headers)


# ---------------------------------------------------------------- DELETE


def test_delete_then_everything_is_404(srv: ServerProcess) -> None:
    u = new_stream(srv, body=b"doomed")
    status, headers, body = request("DELETE", u)
    assert (status, body) == (204, b"")
    assert_security_headers(headers)
    assert read(u)[0] == 404
    assert head(u)[0] == 404
    assert append(u, b"x")[0] == 404
    assert close(u)[0] == 404
    assert request("DELETE", u)[0] == 404
    # The path can be used again, by a brand-new empty stream.
    assert create(u, "text/plain")[0] == 201
    assert read(u)[2] == b""


def test_delete_missing_is_404(srv: ServerProcess) -> None:
    assert request("DELETE", stream_url(srv.url, unique("missing")))[0] == 404


def test_delete_closed_stream(srv: ServerProcess) -> None:
    u = new_stream(srv, body=b"x")
    close(u)
    assert request("DELETE", u)[0] == 204
    assert head(u)[0] == 404


# ------------------------------------------------------------- cold tier


def test_reads_stay_byte_exact_after_data_moves_to_the_cold_tier(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Small segments, immediate flushing and no hot retention: reads come from cold objects."""
    data_dir = tmp_path_factory.mktemp("read-cold") / "data"
    args = [
        "--segment-bytes",
        "1048576",
        "--max-body-bytes",
        "500000",
        "--hot-retention-s",
        "0",
        "--flush-interval-s",
        "0.2",
        "--flush-bytes",
        "1000",
        "--cold-object-bytes",
        "100000",
        "--read-chunk-bytes",
        "65536",
    ]
    srv = ServerProcess(data_dir, *args).start()
    rnd = random.Random(5)
    chunks = [rnd.randbytes(rnd.randint(1, 250_000)) for _ in range(9)] + [ALL_BYTES]
    u = new_stream(srv)
    offsets = [head(u)[1]["Stream-Next-Offset"]]
    for c in chunks:
        offsets.append(append(u, c)[1]["Stream-Next-Offset"])
    j = new_stream(srv, "application/json")
    messages = [{"i": i, "text": "line\n" * (i % 7), "pad": "x" * 3000} for i in range(200)]
    for i in range(0, 200, 25):
        append(j, json.dumps(messages[i : i + 25]), "application/json")
    f = stream_url(srv.url, unique("cold-fork"))
    fork_headers = {
        "Stream-Forked-From": u[u.index("/v1/") :],
        "Stream-Fork-Offset": offsets[4],
        "Stream-Fork-Sub-Offset": "3",
    }
    assert request("PUT", f, fork_headers, b"own")[0] == 201
    expected = b"".join(chunks)
    deadline = time.monotonic() + scaled(20)
    while not any(data_dir.rglob("*.parquet")) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # let the flusher finish and drop hot copies

    def check() -> None:
        for i, off in enumerate(offsets):
            assert read_all(u, off)[0] == b"".join(chunks[i:]), i
        assert read_all(f)[0] == b"".join(chunks[:4]) + chunks[4][:3] + b"own"
        got: list[object] = []
        offset = "-1"
        while True:
            _, headers, body = read(j, offset)
            got.extend(json.loads(body))
            offset = headers["Stream-Next-Offset"]
            if headers.get("Stream-Up-To-Date") == "true":
                break
        assert got == messages

    try:
        assert any(data_dir.rglob("*.parquet")), "nothing reached the cold tier"
        check()
        assert read_all(u)[0] == expected
        port = srv.port
        assert srv.stop() == 0
        srv = ServerProcess(data_dir, *args)
        srv.port = port  # same address: the URLs above stay valid
        srv.start()
        check()
    finally:
        srv.stop()
