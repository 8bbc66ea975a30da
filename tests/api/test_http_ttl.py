"""Stream-TTL (sliding) and Stream-Expires-At (absolute) expiry."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from tests.support.http_helpers import (
    append,
    create,
    head,
    module_server,
    read,
    request,
    stream_url,
    unique,
)
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from module_server(tmp_path_factory, "ttl")


def rfc3339(dt: datetime) -> str:
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_ttl_expiry_makes_the_stream_404_and_the_path_reusable(srv: ServerProcess) -> None:
    u = stream_url(srv.url, unique("ttl"))
    assert create(u, "text/plain", "short-lived", Stream_TTL="1")[0] == 201
    old_etag = read(u)[1]["ETag"]
    assert head(u)[1]["Stream-TTL"] == "1"
    time.sleep(1.4)
    assert read(u)[0] == 404
    assert head(u)[0] == 404
    assert read(u, "-1", live="long-poll")[0] == 404
    assert read(u, "-1", live="sse")[0] == 404
    assert append(u, "x", "text/plain")[0] == 404
    assert request("DELETE", u)[0] == 404
    # Creating again makes a brand-new, empty stream, above every offset of the expired one.
    status, headers, _ = create(u, "text/plain", Stream_TTL="1")
    assert status == 201
    assert headers["Stream-Next-Offset"] == "0000000000000000_0000000000000012"  # "short-lived": 0..11
    assert read(u, "0000000000000000_0000000000000000")[0] == 410
    status, headers, body = read(u)
    assert body == b""
    assert headers["ETag"] != old_etag


def test_sliding_ttl_is_refreshed_by_reads_and_appends_but_not_head(srv: ServerProcess) -> None:
    by_read, by_append, by_head = (stream_url(srv.url, unique(p)) for p in ("read", "append", "head"))
    for u in (by_read, by_append, by_head):
        assert create(u, "text/plain", "x", Stream_TTL="2")[0] == 201
    t0 = time.monotonic()

    def at(t: float) -> None:
        time.sleep(max(0.0, t0 + t - time.monotonic()))

    at(1.0)
    assert read(by_read)[0] == 200
    assert append(by_append, "y", "text/plain")[0] == 204
    assert head(by_head)[0] == 200
    at(2.5)  # 2.5 s after creation, 1.5 s after the refresh
    assert head(by_head)[0] == 404
    assert head(by_read)[0] == 200
    assert head(by_append)[0] == 200
    assert read(by_append)[2] == b"xy"  # (this read refreshes by_append once more)
    at(3.6)  # 2.6 s after by_read's refresh, 1.1 s after by_append's second one
    assert head(by_read)[0] == 404
    assert head(by_append)[0] == 200


def test_expires_at_is_absolute(srv: ServerProcess) -> None:
    u = stream_url(srv.url, unique("exp"))
    deadline = datetime.now(UTC) + timedelta(seconds=1.5)
    stamp = rfc3339(deadline)
    assert create(u, "text/plain", "until then", Stream_Expires_At=stamp)[0] == 201
    h = head(u)[1]
    assert h["Stream-Expires-At"] == stamp
    assert "Stream-TTL" not in h
    time.sleep(0.7)
    # Activity does not extend an absolute deadline.
    assert read(u)[2] == b"until then"
    assert append(u, "!", "text/plain")[0] == 204
    time.sleep(max(0.0, (deadline - datetime.now(UTC)).total_seconds()) + 0.3)
    assert head(u)[0] == 404
    assert read(u)[0] == 404
    assert append(u, "x", "text/plain")[0] == 404


def test_expired_source_with_a_fork(srv: ServerProcess) -> None:
    src = stream_url(srv.url, unique("src"))
    create(src, "text/plain", "inherited", Stream_TTL="1")
    f = stream_url(srv.url, unique("fork"))
    status, _, _ = request(
        "PUT", f, {"Stream-Forked-From": src[src.index("/v1/") :], "Stream-TTL": "3600"}, b""
    )
    assert status == 201
    time.sleep(1.4)
    assert head(src)[0] == 404
    assert read(f)[2] == b"inherited"
    # The expired source's path can be reused; the fork keeps its own view.
    assert create(src, "text/plain", "new")[0] == 201
    assert read(src)[2] == b"new"
    assert read(f)[2] == b"inherited"
