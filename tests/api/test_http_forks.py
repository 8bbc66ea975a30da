"""Forks: inherited data, fork offsets and sub-offsets, independence, soft-delete and cascade."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from tests.support.http_helpers import (
    Background,
    SseReader,
    append,
    close,
    create,
    error_message,
    head,
    module_server,
    new_stream,
    read,
    read_all,
    request,
    stream_url,
    unique,
)
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from module_server(tmp_path_factory, "forks")


def path_of(u: str) -> str:
    return u[u.index("/v1/") :]


def fork(
    srv: ServerProcess,
    source: str,
    offset: str | None = None,
    sub: str | None = None,
    content_type: str | None = None,
    target: str | None = None,
    body: bytes | str = b"",
    **extra: str,
) -> tuple[str, int, object, bytes]:
    target = target or stream_url(srv.url, unique("fork"))
    headers = {"Stream-Forked-From": path_of(source), **{k.replace("_", "-"): v for k, v in extra.items()}}
    if offset is not None:
        headers["Stream-Fork-Offset"] = offset
    if sub is not None:
        headers["Stream-Fork-Sub-Offset"] = sub
    if content_type is not None:
        headers["Content-Type"] = content_type
    status, h, resp = request("PUT", target, headers, body)
    return target, status, h, resp


def test_fork_at_tail_inherits_everything(srv: ServerProcess) -> None:
    src = new_stream(srv, body=bytes(range(256)))
    f, status, headers, _ = fork(srv, src)
    assert status == 201
    assert headers["Location"] == f
    assert headers["Content-Type"] == "application/octet-stream"
    assert headers["Stream-Next-Offset"] == head(src)[1]["Stream-Next-Offset"]
    assert read(f)[2] == bytes(range(256))


def test_fork_at_offset_then_diverge(srv: ServerProcess) -> None:
    src = new_stream(srv, "text/plain", "hello ")
    mid = head(src)[1]["Stream-Next-Offset"]
    append(src, "world", "text/plain")
    f, status, headers, _ = fork(srv, src, offset=mid)
    assert status == 201
    assert headers["Content-Type"] == "text/plain"  # inherited
    assert headers["Stream-Next-Offset"] == mid
    assert read(f)[2] == b"hello "
    fork_tail = append(f, "there", "text/plain")[1]["Stream-Next-Offset"]
    append(src, "!", "text/plain")
    # Each side sees only its own continuation; offsets are shared up to the fork point.
    assert read(f)[2] == b"hello there"
    assert read(src)[2] == b"hello world!"
    assert read(f, mid)[2] == b"there"
    assert read(src, mid)[2] == b"world!"
    assert read(f)[1]["Stream-Next-Offset"] == fork_tail


def test_fork_with_initial_body(srv: ServerProcess) -> None:
    src = new_stream(srv, "text/plain", "abc")
    f, status, _, _ = fork(srv, src, body="def")
    assert status == 201
    assert read(f)[2] == b"abcdef"


def test_fork_at_start_is_empty(srv: ServerProcess) -> None:
    src = new_stream(srv, body=b"abc")
    f, status, headers, _ = fork(srv, src, offset="0000000000000000_0000000000000000")
    assert status == 201
    assert read(f)[2] == b""


def test_binary_sub_offset_counts_bytes(srv: ServerProcess) -> None:
    src = new_stream(srv, body=b"0123456789")
    f, status, _, _ = fork(srv, src, offset="0000000000000000_0000000000000000", sub="4")
    assert status == 201
    assert read(f)[2] == b"0123"
    f0, status, _, _ = fork(srv, src, offset="0000000000000000_0000000000000000", sub="0")
    assert status == 201
    assert read(f0)[2] == b""
    f10, status, _, _ = fork(srv, src, offset="0000000000000000_0000000000000000", sub="10")
    assert status == 201
    assert read(f10)[2] == b"0123456789"


def test_json_sub_offset_counts_messages(srv: ServerProcess) -> None:
    src = new_stream(srv, "application/json", '[{"m":1},{"m":"two\\nlines"},{"m":3}]')
    mid = append(src, '{"m":4}', "application/json")[1]["Stream-Next-Offset"]
    append(src, '{"m":5}', "application/json")
    start = "0000000000000000_0000000000000000"
    f, status, _, _ = fork(srv, src, offset=start, sub="2")
    assert status == 201
    assert json.loads(read(f)[2]) == [{"m": 1}, {"m": "two\nlines"}]
    f2, status, _, _ = fork(srv, src, offset=mid, sub="1")
    assert status == 201
    assert json.loads(read(f2)[2]) == [{"m": 1}, {"m": "two\nlines"}, {"m": 3}, {"m": 4}, {"m": 5}]
    # Reads spanning the fork boundary are one JSON array.
    append(f, '[{"f":1},{"f":2}]', "application/json")
    assert json.loads(read(f)[2]) == [{"m": 1}, {"m": "two\nlines"}, {"f": 1}, {"f": 2}]
    # Past the last message is an overshoot.
    _, status, _, _ = fork(srv, src, offset=mid, sub="2")
    assert status == 400


@pytest.mark.parametrize("sub", ["-1", "1.5", "01", "x", "11"])
def test_bad_or_overshooting_sub_offset_is_400(srv: ServerProcess, sub: str) -> None:
    src = new_stream(srv, body=b"0123456789")
    f, status, _, body = fork(srv, src, offset="0000000000000000_0000000000000000", sub=sub)
    assert status == 400
    assert error_message(body)
    assert head(f)[0] == 404


def test_fork_offset_errors(srv: ServerProcess) -> None:
    src = new_stream(srv, body=b"abc")
    longer = new_stream(srv, body=b"abcdef")
    beyond = head(longer)[1]["Stream-Next-Offset"]
    for offset in ("garbage", "-1", "now", beyond):
        f, status, _, body = fork(srv, src, offset=offset)
        assert status == 400, offset
        assert head(f)[0] == 404


def test_fork_of_missing_source_is_404(srv: ServerProcess) -> None:
    f, status, _, body = fork(srv, stream_url(srv.url, unique("nope")))
    assert status == 404
    assert error_message(body)
    assert head(f)[0] == 404


def test_fork_offset_without_source_is_400(srv: ServerProcess) -> None:
    u = stream_url(srv.url, unique("fork"))
    for headers in (
        {"Stream-Fork-Offset": "0000000000000000_0000000000000000"},
        {"Stream-Fork-Sub-Offset": "1"},
    ):
        assert request("PUT", u, headers, b"")[0] == 400
    assert head(u)[0] == 404


def test_fork_content_type_must_match_source(srv: ServerProcess) -> None:
    src = new_stream(srv, "text/plain; charset=utf-8", "x")
    f, status, _, _ = fork(srv, src, content_type="application/json")
    assert status == 409
    assert head(f)[0] == 404
    f, status, headers, _ = fork(srv, src, content_type="text/plain")
    assert status == 201


def test_fork_creation_is_idempotent(srv: ServerProcess) -> None:
    src = new_stream(srv, body=b"abcdef")
    mid = append(src, b"ghi")[1]["Stream-Next-Offset"]
    append(src, b"jkl")
    f, status, _, _ = fork(srv, src, offset=mid)
    assert status == 201
    _, status, headers, _ = fork(srv, src, offset=mid, target=f)
    assert status == 200
    assert headers["Stream-Next-Offset"] == mid
    # A different fork point at the same target is a different configuration.
    _, status, _, _ = fork(srv, src, offset="0000000000000000_0000000000000000", target=f)
    assert status == 409
    other = new_stream(srv, body=b"abcdefghi")
    _, status, _, _ = fork(srv, other, offset=mid, target=f)
    assert status == 409
    # A plain create at a fork's path does not match it either.
    assert create(f, "application/octet-stream")[0] == 409
    assert read(f)[2] == b"abcdefghi"


def test_fork_of_closed_stream_starts_open(srv: ServerProcess) -> None:
    src = new_stream(srv, body=b"final")
    close(src)
    f, status, headers, _ = fork(srv, src)
    assert status == 201
    assert "Stream-Closed" not in headers
    assert "Stream-Closed" not in head(f)[1]
    assert append(f, b"+more")[0] == 204
    assert read(f)[2] == b"final+more"
    assert head(src)[1]["Stream-Closed"] == "true"


def test_fork_can_be_created_closed(srv: ServerProcess) -> None:
    src = new_stream(srv, body=b"abc")
    f, status, headers, _ = fork(srv, src, Stream_Closed="true")
    assert status == 201
    assert headers["Stream-Closed"] == "true"
    assert read(f)[1]["Stream-Closed"] == "true"


def test_fork_does_not_inherit_writer_state(srv: ServerProcess) -> None:
    src = new_stream(srv, "text/plain")
    for seq in range(3):
        request(
            "POST",
            src,
            {
                "Content-Type": "text/plain",
                "Producer-Id": "p",
                "Producer-Epoch": "0",
                "Producer-Seq": str(seq),
                "Stream-Seq": f"s{seq}",
            },
            str(seq),
        )
    f, status, _, _ = fork(srv, src)
    assert status == 201
    # On the source (epoch 0, seq 0) is an old duplicate; on the fork it is a fresh producer.
    produce0 = {"Content-Type": "text/plain", "Producer-Id": "p", "Producer-Epoch": "0", "Producer-Seq": "0"}
    assert request("POST", src, produce0, "dup")[0] == 204
    assert request("POST", f, produce0, "new")[0] == 200
    # The source's Stream-Seq high-water mark does not apply to the fork either.
    assert append(src, "x", "text/plain", Stream_Seq="a")[0] == 409
    assert append(f, "x", "text/plain", Stream_Seq="a")[0] == 204
    assert read(f)[2] == b"012newx"
    assert read(src)[2] == b"012"


def test_fork_of_a_fork(srv: ServerProcess) -> None:
    a = new_stream(srv, "text/plain", "a1,")
    b, _, _, _ = fork(srv, a, body="b1,")
    append(a, "a2,", "text/plain")
    c, status, _, _ = fork(srv, b, body="c1,")
    assert status == 201
    append(b, "b2,", "text/plain")
    assert read(a)[2] == b"a1,a2,"
    assert read(b)[2] == b"a1,b1,b2,"
    assert read(c)[2] == b"a1,b1,c1,"


def test_fork_from_another_bucket(srv: ServerProcess) -> None:
    assert request("PUT", f"{srv.url}/v1/buckets/fork-src-bucket")[0] in (200, 201)
    src = stream_url(srv.url, unique("src"), bucket="fork-src-bucket")
    create(src, "text/plain", "from a bucket")
    f, status, _, _ = fork(srv, src)
    assert status == 201
    assert read(f)[2] == b"from a bucket"


# ------------------------------------------------------------------ TTL


def test_fork_expiry_inheritance(srv: ServerProcess) -> None:
    ttl_src = stream_url(srv.url, unique("src"))
    create(ttl_src, "text/plain", Stream_TTL="3600")
    exp_src = stream_url(srv.url, unique("src"))
    create(exp_src, "text/plain", Stream_Expires_At="2999-01-01T00:00:00Z")
    plain_src = new_stream(srv, "text/plain")

    f, _, _, _ = fork(srv, ttl_src)
    assert head(f)[1]["Stream-TTL"] == "3600"
    f, _, _, _ = fork(srv, exp_src)
    h = head(f)[1]
    assert h["Stream-Expires-At"] == "2999-01-01T00:00:00Z"
    assert "Stream-TTL" not in h
    f, _, _, _ = fork(srv, plain_src)
    h = head(f)[1]
    assert "Stream-TTL" not in h and "Stream-Expires-At" not in h
    # A fork's own expiry wins, in every direction.
    f, _, _, _ = fork(srv, ttl_src, Stream_TTL="60")
    assert head(f)[1]["Stream-TTL"] == "60"
    f, _, _, _ = fork(srv, ttl_src, Stream_Expires_At="2998-01-01T00:00:00Z")
    h = head(f)[1]
    assert h["Stream-Expires-At"] == "2998-01-01T00:00:00Z"
    assert "Stream-TTL" not in h
    f, _, _, _ = fork(srv, exp_src, Stream_TTL="120")
    h = head(f)[1]
    assert h["Stream-TTL"] == "120"
    assert "Stream-Expires-At" not in h
    f, _, _, _ = fork(srv, plain_src, Stream_TTL="30")
    assert head(f)[1]["Stream-TTL"] == "30"


# ----------------------------------------------------------- soft delete


def test_deleting_a_source_with_forks_is_a_soft_delete(srv: ServerProcess) -> None:
    src = new_stream(srv, "text/plain", "shared history")
    f, _, _, _ = fork(srv, src)
    assert request("DELETE", src)[0] == 204
    # Every direct operation on the source says it is gone.
    status, _, body = read(src)
    assert status == 410
    assert error_message(body)
    assert head(src)[:1] == (410,)
    assert head(src)[2] == b""
    assert append(src, "x", "text/plain")[0] == 410
    assert close(src)[0] == 410
    assert request("DELETE", src)[0] == 410
    assert read(src, "-1", live="long-poll")[0] == 410
    assert read(src, "-1", live="sse")[0] == 410
    # Its path cannot be reused while the fork holds it.
    assert create(src, "text/plain")[0] == 409
    # Nor can it be forked again.
    _, status, _, _ = fork(srv, src)
    assert status == 409
    # The fork still reads the inherited bytes.
    assert read(f)[2] == b"shared history"
    append(f, " and more", "text/plain")
    assert read(f)[2] == b"shared history and more"


def test_deleting_the_last_fork_cleans_up_the_source(srv: ServerProcess) -> None:
    src = new_stream(srv, "text/plain", "old")
    f1, _, _, _ = fork(srv, src)
    f2, _, _, _ = fork(srv, src)
    request("DELETE", src)
    assert request("DELETE", f1)[0] == 204
    assert head(src)[0] == 410  # f2 still references it
    assert read(f2)[2] == b"old"
    assert request("DELETE", f2)[0] == 204
    assert head(src)[0] == 404
    assert head(f2)[0] == 404
    # The path is free for a brand-new stream.
    assert create(src, "application/json")[0] == 201
    assert read(src)[2] == b"[]"


def test_cascade_through_a_fork_chain(srv: ServerProcess) -> None:
    a = new_stream(srv, "text/plain", "A")
    b, _, _, _ = fork(srv, a, body="B")
    c, _, _, _ = fork(srv, b, body="C")
    assert request("DELETE", a)[0] == 204
    assert request("DELETE", b)[0] == 204
    assert head(a)[0] == 410
    assert head(b)[0] == 410
    assert read(c)[2] == b"ABC"
    assert request("DELETE", c)[0] == 204
    for u in (a, b, c):
        assert head(u)[0] == 404
        assert create(u, "text/plain")[0] == 201


def test_deleting_a_fork_leaves_the_source_alone(srv: ServerProcess) -> None:
    src = new_stream(srv, "text/plain", "keep")
    f, _, _, _ = fork(srv, src)
    assert request("DELETE", f)[0] == 204
    assert read(src)[2] == b"keep"
    # With no forks left, deleting the source is a hard delete.
    assert request("DELETE", src)[0] == 204
    assert head(src)[0] == 404


# -------------------------------------------------------------- live


def test_long_poll_on_fork_ignores_source_appends(srv: ServerProcess) -> None:
    src = new_stream(srv, "text/plain", "base")
    f, _, _, _ = fork(srv, src)
    tail = head(f)[1]["Stream-Next-Offset"]
    # Inherited data is returned at once.
    status, _, body = read(f, "-1", live="long-poll")
    assert (status, body) == (200, b"base")
    # At the fork's tail only the fork's own appends count.
    waiter = Background(lambda: read(f, tail, live="long-poll"))
    time.sleep(0.3)
    append(src, "source-only", "text/plain")
    status, headers, _ = waiter.result()
    assert status == 204
    assert headers["Stream-Next-Offset"] == tail
    waiter = Background(lambda: read(f, tail, live="long-poll"))
    time.sleep(0.3)
    append(f, "fork-only", "text/plain")
    status, _, body = waiter.result()
    assert (status, body) == (200, b"fork-only")
    assert waiter.elapsed < 2.0


def test_sse_on_fork_streams_inherited_then_own_data_only(srv: ServerProcess) -> None:
    src = new_stream(srv, "text/plain", "inherited|")
    f, _, _, _ = fork(srv, src)
    append(src, "source-after-fork|", "text/plain")
    with SseReader(f, "-1") as sse:
        events = sse.read_until(lambda ev: any(e.event == "control" and e.json().get("upToDate") for e in ev))
        assert "".join(e.data for e in events if e.event == "data") == "inherited|"
        append(src, "source-again|", "text/plain")
        append(f, "fork-own|", "text/plain", Stream_Closed="true")
        events = sse.read_to_eof()
        assert "".join(e.data for e in events if e.event == "data") == "inherited|fork-own|"
        assert events[-1].json()["streamClosed"] is True


def test_chunked_reads_of_a_fork_chain_are_byte_exact(tmp_path_factory: pytest.TempPathFactory) -> None:
    srv = ServerProcess(tmp_path_factory.mktemp("fork-chunky") / "data", "--read-chunk-bytes", "3").start()
    try:
        a = new_stream(srv, "application/octet-stream", bytes(range(0, 10)))
        append(a, bytes(range(10, 20)))
        b, _, _, _ = fork(srv, a, body=bytes(range(100, 107)))
        append(a, b"\xff" * 5)  # after the fork point: never part of b or c
        c, _, _, _ = fork(srv, b, offset=head(b)[1]["Stream-Next-Offset"], body=bytes(range(200, 211)))
        expected = bytes(range(0, 20)) + bytes(range(100, 107)) + bytes(range(200, 211))
        data, responses = read_all(c)
        assert data == expected
        assert len(responses) == -(-len(expected) // 3)
        # Every intermediate offset is a valid place to resume.
        for _, headers, _ in responses:
            off = headers["Stream-Next-Offset"]
            rest, _ = read_all(c, off)
            assert expected.endswith(rest)
    finally:
        srv.stop()
