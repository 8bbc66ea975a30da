"""Cluster mode over HTTP (local durability): any node accepts any request; a paused owner acknowledges nothing.

Two ``tiered serve`` processes on one moto prefix, 4 shards, lease TTL 1.5 s.
With local durability a shard stays with its last writer, so the first node
serves every shard and the second forwards to it: that is exactly the
routing under test. The object-store mode, where shards move, is in
``test_cluster_chaos.py``.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster_support import readiness, start_node, unique_prefix
from tests.support.deadlines import scaled
from tests.support.http_helpers import append, create, read, request, unique
from tests.support.s3_server import S3Endpoint
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.timeout(120)

TTL = 1.5


@pytest.fixture
def pair(moto_s3: S3Endpoint, tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    prefix = unique_prefix("pair")
    first = start_node(tmp_path, moto_s3, prefix, "n1", shards=4, ttl_s=TTL)
    second: ServerProcess | None = None
    try:
        second = start_node(tmp_path, moto_s3, prefix, "n2", shards=4, ttl_s=TTL)
        yield first, second
    finally:
        if first.proc is not None and first.proc.poll() is None:
            os.killpg(first.proc.pid, signal.SIGCONT)
        if second is not None:
            second.stop()
        first.stop()


def post(url: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
    """An append; a request left hanging (forwarded to a node being paused) counts as status 0."""
    try:
        status, headers, data = request(
            "POST", url, {"Content-Type": "application/octet-stream"}, body, timeout=5
        )
    except TimeoutError:
        return 0, {}, b""
    return status, dict(headers), data


def _until(check: object, timeout: float) -> bool:
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


def test_any_node_accepts_any_request_and_forwards_to_the_owner(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    owner, other = pair
    assert readiness(owner.url)["checks"]["serving"] == [0, 1, 2, 3]  # type: ignore[index]
    assert readiness(other.url)["checks"]["serving"] == []  # type: ignore[index]
    names = [unique("fw") for _ in range(8)]  # spread over the 4 shards
    payloads = {name: [os.urandom(37), b"\x00\xff" * 50, b"tail"] for name in names}
    for name, chunks in payloads.items():
        assert create(f"{other.url}/v1/stream/{name}")[0] == 201
        for i, chunk in enumerate(chunks):
            via = (owner, other)[i % 2]
            status, headers, _ = append(f"{via.url}/v1/stream/{name}", chunk)
            assert status == 204, (name, i)
    for name, chunks in payloads.items():
        for via in (owner, other):
            status, _, body = read(f"{via.url}/v1/stream/{name}", "-1")
            assert status == 200 and body == b"".join(chunks)
    # A client that follows redirects may ask for one instead of a proxied answer.
    name = names[0]
    status, headers, _ = request("GET", f"{other.url}/v1/stream/{name}?offset=-1", {"Tiered-Redirect": "307"})
    assert status == 307 and headers["Location"] == f"{owner.url}/v1/stream/{name}?offset=-1"
    # Node-level routes answer locally.
    assert request("GET", other.url + "/healthz")[0] == 200


def test_a_paused_owner_is_not_forwarded_to_and_acknowledges_nothing_after_its_window(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    owner, other = pair
    assert owner.proc is not None
    name = unique("zombie")
    url_other = f"{other.url}/v1/stream/{name}"
    assert create(url_other)[0] == 201
    assert append(url_other, b"before")[0] == 204
    os.killpg(owner.proc.pid, signal.SIGSTOP)
    try:
        # Past TTL + margin on the other node's clock: it no longer forwards (the owner would hang).
        assert _until(lambda: post(url_other, b"x")[0] == 503, 6 * TTL + 10)
        status, headers, body = post(url_other, b"x")
        assert status == 503 and headers.get("Retry-After", headers.get("retry-after")) == "1", (
            headers,
            body,
        )
        time.sleep(TTL)
    finally:
        os.killpg(owner.proc.pid, signal.SIGCONT)
    # Resumed: the window closed on its own clock; it rejoins as a new incarnation and takes its shards
    # back (local durability: their data is on its disk). Until then it refuses, never acknowledges.
    url_owner = f"{owner.url}/v1/stream/{name}"
    statuses = []
    deadline = time.monotonic() + scaled(6 * TTL)
    while time.monotonic() < deadline:
        status = post(url_owner, b"after")[0]
        statuses.append(status)
        if status == 204:
            break
        assert status == 503
        time.sleep(0.1)
    assert statuses[-1] == 204, statuses
    ready = readiness(owner.url)
    assert ready["checks"]["incarnation"] == 2  # type: ignore[index]
    for via in (owner, other):
        status, _, body = read(f"{via.url}/v1/stream/{name}", "-1")
        assert status == 200 and body == b"before" + b"after", body


def test_a_bucket_created_through_any_node_takes_streams_in_every_shard(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    owner, other = pair
    bucket = f"b{unique('x')[-8:]}".replace("-", "")
    status, _, body = request("PUT", f"{other.url}/v1/buckets/{bucket}")
    assert status == 201, body
    assert request("PUT", f"{owner.url}/v1/buckets/{bucket}")[0] == 200  # idempotent, every shard agrees
    names = [unique("inb") for _ in range(8)]  # over all 4 shards
    for i, name in enumerate(names):
        via = (owner, other)[i % 2]
        url = f"{via.url}/v1/buckets/{bucket}/stream/{name}"
        assert create(url)[0] == 201, name
        assert post(url, name.encode())[0] == 204
    for name in names:
        status, _, body = read(f"{other.url}/v1/buckets/{bucket}/stream/{name}", "-1")
        assert status == 200 and body == name.encode()
    status, _, body = request("GET", f"{owner.url}/v1/buckets/{bucket}")
    assert status == 200 and bucket.encode() in body


def test_forwarding_keeps_the_request_as_the_client_sent_it(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    owner, other = pair
    name = unique("raw")
    assert create(f"{other.url}/v1/stream/{name}")[0] == 201
    # No Content-Type on an append: refused by the owner (a proxy must not add one).
    status, _, body = request("POST", f"{other.url}/v1/stream/{name}", {}, b"data")
    direct = request("POST", f"{owner.url}/v1/stream/{name}", {}, b"data")[0]
    assert status == direct == 400, body
