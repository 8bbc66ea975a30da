"""Append (POST) and close: 204s, tails, content-type rules, Stream-Seq, closure.

Each test runs on one node, on a single-node cluster (every shard's engine behind shard
routing) and on one in object-store durability (every acknowledgement after a WAL commit):
the server fixture's deployments (``tests/support/deployments.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import deployments
from tests.support.http_helpers import (
    Background,
    append,
    assert_security_headers,
    close,
    create,
    error_message,
    head,
    new_stream,
    read,
    request,
    state_of,
    stream_url,
    unique,
)
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(
    scope="module", params=(deployments.SINGLE_NODE, deployments.CLUSTER_NODE, deployments.CLUSTER_NODE_WAL)
)
def srv(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    yield from deployments.module_server(request, "append")


def test_append_is_204_with_increasing_next_offset(srv: ServerProcess) -> None:
    u = new_stream(srv)
    offsets = [head(u)[1]["Stream-Next-Offset"]]
    chunks = [b"a", b"bc", b"\x00\xff", b"def" * 100]
    for chunk in chunks:
        status, headers, body = append(u, chunk)
        assert status == 204
        assert body == b""
        assert "Stream-Closed" not in headers
        assert headers["Stream-Next-Offset"] > offsets[-1]
        offsets.append(headers["Stream-Next-Offset"])
        assert_security_headers(headers)
    assert head(u)[1]["Stream-Next-Offset"] == offsets[-1]
    # Each returned offset starts exactly after the bytes acknowledged with it.
    everything = b"".join(chunks)
    consumed = 0
    for off, chunk in zip(offsets, [b"", *chunks], strict=True):
        consumed += len(chunk)
        assert read(u, off)[2] == everything[consumed:]


def test_append_to_missing_stream_is_404(srv: ServerProcess) -> None:
    u = stream_url(srv.url, unique("missing"))
    status, headers, body = append(u, b"x")
    assert status == 404
    assert error_message(body)
    assert_security_headers(headers)
    assert close(u)[0] == 404
    assert head(u)[0] == 404


def test_content_type_mismatch_is_409(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain")
    before = state_of(u)
    status, headers, body = append(u, b"{}", "application/json")
    assert status == 409
    assert "Stream-Closed" not in headers
    assert error_message(body)
    assert state_of(u) == before


def test_content_type_match_ignores_parameters_and_case(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain; charset=utf-8")
    assert append(u, "a", "text/plain")[0] == 204
    assert append(u, "b", "TEXT/PLAIN; charset=UTF-8")[0] == 204
    assert read(u)[2] == b"ab"


def test_missing_content_type_is_400(srv: ServerProcess) -> None:
    u = new_stream(srv)
    before = state_of(u)
    status, _, body = request("POST", u, {}, b"data")
    assert status == 400
    assert "Content-Type" in error_message(body)
    assert state_of(u) == before


@pytest.mark.parametrize("content_type", ["octet-stream", "application/", "appli cation/octet-stream"])
def test_invalid_content_type_is_400(srv: ServerProcess, content_type: str) -> None:
    u = new_stream(srv)
    before = state_of(u)
    status, _, _ = append(u, b"data", content_type)
    assert status == 400
    assert state_of(u) == before


def test_empty_body_is_400(srv: ServerProcess) -> None:
    u = new_stream(srv)
    append(u, b"x")
    before = state_of(u)
    status, _, body = append(u, b"")
    assert status == 400
    assert error_message(body)
    assert state_of(u) == before


@pytest.mark.parametrize("value", ["false", "yes", "1"])
def test_empty_body_with_non_true_stream_closed_is_400(srv: ServerProcess, value: str) -> None:
    u = new_stream(srv)
    status, _, _ = request("POST", u, {"Stream-Closed": value}, b"")
    assert status == 400
    assert "Stream-Closed" not in head(u)[1]


def test_chunked_transfer_encoding_append(srv: ServerProcess) -> None:
    u = new_stream(srv)
    pieces = [bytes(range(i, i + 50)) for i in range(0, 200, 50)]
    status, headers, _ = request(
        "POST", u, {"Content-Type": "application/octet-stream"}, pieces, chunked=True
    )
    assert status == 204
    assert headers["Stream-Next-Offset"] == head(u)[1]["Stream-Next-Offset"]
    assert read(u)[2] == b"".join(pieces)


def test_stream_seq_must_strictly_increase(srv: ServerProcess) -> None:
    u = new_stream(srv)
    assert append(u, b"1", Stream_Seq="0005")[0] == 204
    assert append(u, b"2", Stream_Seq="0009")[0] == 204
    before = state_of(u)
    for regression in ("0009", "0008", "0"):
        status, _, body = append(u, b"bad", Stream_Seq=regression)
        assert status == 409, regression
        assert error_message(body)
    status, _, body = append(u, b"bad", Stream_Seq="")  # empty is not a value at all
    assert status == 400 and error_message(body) == "Stream-Seq must not be empty"
    assert state_of(u) == before
    # Appends without Stream-Seq are not sequence-checked.
    assert append(u, b"3")[0] == 204
    assert append(u, b"4", Stream_Seq="0010")[0] == 204
    assert read(u)[2] == b"1234"


def test_stream_seq_compares_lexicographically_not_numerically(srv: ServerProcess) -> None:
    u = new_stream(srv)
    assert append(u, b"a", Stream_Seq="9")[0] == 204
    # "10" < "9" byte-wise: a regression even though 10 > 9 as numbers.
    assert append(u, b"b", Stream_Seq="10")[0] == 409
    assert append(u, b"c", Stream_Seq="9a")[0] == 204
    assert read(u)[2] == b"ac"


# ------------------------------------------------------------------- close


def test_close_only_is_204_idempotent_and_keeps_the_tail(srv: ServerProcess) -> None:
    u = new_stream(srv)
    tail = append(u, b"data")[1]["Stream-Next-Offset"]
    status, headers, body = close(u)
    assert (status, body) == (204, b"")
    assert headers["Stream-Closed"] == "true"
    assert headers["Stream-Next-Offset"] == tail
    h = head(u)[1]
    assert h["Stream-Closed"] == "true"
    assert h["Stream-Next-Offset"] == tail
    # Closing again is an idempotent success.
    status, headers, _ = close(u)
    assert status == 204
    assert headers["Stream-Closed"] == "true"
    assert headers["Stream-Next-Offset"] == tail
    assert read(u)[2] == b"data"


def test_close_only_ignores_a_mismatched_content_type(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain")
    status, headers, _ = request("POST", u, {"Stream-Closed": "true", "Content-Type": "image/png"}, b"")
    assert status == 204
    assert headers["Stream-Closed"] == "true"


def test_close_header_is_case_insensitive(srv: ServerProcess) -> None:
    u = new_stream(srv)
    status, headers, _ = request("POST", u, {"Stream-Closed": "True"}, b"")
    assert status == 204
    assert headers["Stream-Closed"] == "true"


def test_append_and_close_is_atomic(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain")
    append(u, "first,", "text/plain")
    status, headers, _ = append(u, "last", "text/plain", Stream_Closed="true")
    assert status == 204
    assert headers["Stream-Closed"] == "true"
    assert headers["Stream-Next-Offset"] == head(u)[1]["Stream-Next-Offset"]
    status, headers, body = read(u)
    assert body == b"first,last"
    assert headers["Stream-Closed"] == "true"


def test_append_after_close_is_409_with_closed_and_final_offset(srv: ServerProcess) -> None:
    u = new_stream(srv)
    append(u, b"abc")
    final = close(u)[1]["Stream-Next-Offset"]
    before = state_of(u)
    for extra in ({}, {"Stream_Closed": "true"}, {"Stream_Seq": "zzz"}):
        status, headers, body = append(u, b"more", **extra)
        assert status == 409, extra
        assert headers["Stream-Closed"] == "true"
        assert headers["Stream-Next-Offset"] == final
        assert error_message(body)
    assert state_of(u) == before


def test_closed_check_takes_precedence_over_content_type_and_seq(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain")
    append(u, "x", "text/plain", Stream_Seq="5")
    close(u)
    status, headers, _ = append(u, "y", "application/json", Stream_Seq="1")
    assert status == 409
    assert headers["Stream-Closed"] == "true"
    assert headers["Stream-Next-Offset"] == head(u)[1]["Stream-Next-Offset"]


def test_closed_stream_remains_readable(srv: ServerProcess) -> None:
    u = new_stream(srv)
    payload = bytes(range(256)) * 3
    append(u, payload, Stream_Closed="true")
    status, headers, body = read(u)
    assert status == 200
    assert body == payload
    assert headers["Stream-Closed"] == "true"


# ------------------------------------------------------------- concurrency


def test_concurrent_appends_are_all_kept_whole_and_in_offset_order(srv: ServerProcess) -> None:
    u = new_stream(srv)
    payloads = [bytes([i]) * (10 + i) for i in range(24)]
    workers = [Background(lambda p=p: append(u, p)) for p in payloads]
    results = [w.result() for w in workers]
    assert all(status == 204 for status, _, _ in results)
    offsets = [headers["Stream-Next-Offset"] for _, headers, _ in results]
    assert len(set(offsets)) == len(offsets)
    content = read(u)[2]
    assert len(content) == sum(len(p) for p in payloads)
    # Each append is contiguous, and its acknowledged offset is where it ends.
    by_end = sorted(zip(offsets, payloads, strict=True))
    assert content == b"".join(p for _, p in by_end)


def test_concurrent_creates_make_exactly_one_stream(srv: ServerProcess) -> None:
    u = stream_url(srv.url, unique("race"))
    workers = [Background(lambda: create(u, "text/plain", "initial")) for _ in range(12)]
    statuses = sorted(w.result()[0] for w in workers)
    assert statuses == [200] * 11 + [201]
    assert read(u)[2] == b"initial"
