"""Catch-up reads below the cold frontier, answered by a node that does not own the stream, from the store.

Two ``tiered serve`` processes on one moto prefix (local durability: the
first node serves every shard, the second owns none), JWT auth, small flush
settings and no hot retention, so appended bytes reach Parquet objects within
a second and reads below the tail come from the cold tier. Through the
non-owner, a read whose whole answer is cold is answered from the store with
the locator the owner gave (``tiered/cluster/gateway/cold_reads.py``); everything else
is forwarded. Asserted: the answers are identical to the owner's (status,
body, protocol headers) and byte-exact; they do not touch the owner (it is
SIGSTOPped and they still succeed); a locator is not used after its validity;
refusals are the owner's; a flipped byte in the cold object is a 502.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.support.auth_support import ADMIN, OPERATOR, AuthServer, bearer
from tests.support.cluster_support import (
    cluster_args,
    cluster_env,
    readiness,
    start_nodes,
    unique_prefix,
    wait_served,
)
from tests.support.deadlines import scaled
from tests.support.http_helpers import Headers, request, unique
from tests.support.s3_server import S3Endpoint
from tiered.cluster.membership.shards import shard_of
from tiered.cold.parquet.chunk_index import ChunkIndex
from tiered.core.ids import DEFAULT_BUCKET, format_offset, parse_offset
from tiered.engine.streams.locators import LOCATOR_HEADER, decode_locator

pytestmark = pytest.mark.timeout(180)

TTL = 3.0  # lease TTL: a SIGSTOP of about a second leaves the owner alive in its peer's view
LOCATOR_TTL = 2.0
CHUNK = 4096
BUCKET = "acme"
PROTOCOL_HEADERS = (
    "Content-Type",
    "Stream-Next-Offset",
    "ETag",
    "Cache-Control",
    "Stream-Up-To-Date",
    "Stream-Closed",
    "Stream-Cursor",
    "Stream-Record",
)


class Node(AuthServer):
    """A cluster node with JWT auth (``AuthServer`` signs tokens with its key; both nodes share it)."""

    def __init__(self, data_dir: Path, s3: S3Endpoint, prefix: str, node_id: str, key: Any = None) -> None:
        args = cluster_args(
            s3,
            prefix,
            node_id,
            shards=2,
            ttl_s=TTL,
            extra=(
                "--flush-interval-s", "0.2",
                "--flush-bytes", "1024",
                "--hot-retention-s", "0",
                "--read-chunk-bytes", str(CHUNK),
                "--cluster-locator-ttl-s", str(LOCATOR_TTL),
            ),
        )  # fmt: skip
        super().__init__(data_dir, *args, key=key)
        self.env = {**cluster_env(), "TIERED_ADMIN_TOKEN": ADMIN}


@pytest.fixture(scope="module")
def pair(moto_s3: S3Endpoint, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Node, Node]]:
    base = tmp_path_factory.mktemp("catchup")
    prefix = unique_prefix("catchup")
    owner = Node(base / "n1", moto_s3, prefix, "n1").start(timeout=40)
    other: Node | None = None
    try:
        other = Node(base / "n2", moto_s3, prefix, "n2", key=owner.key).start(timeout=40)
        assert readiness(other.url)["checks"]["serving"] == []  # type: ignore[index]
        status, _, body = request("PUT", f"{other.url}/v1/buckets/{BUCKET}", OPERATOR)
        assert status == 201, body
        yield owner, other
    finally:
        if owner.proc is not None and owner.proc.poll() is None:
            os.killpg(owner.proc.pid, signal.SIGCONT)
        if other is not None:
            other.stop()
        owner.stop()


def _get(url: str, offset: int | str, headers: dict[str, str]) -> tuple[int, Headers, bytes]:
    token = offset if isinstance(offset, str) else format_offset(offset)
    return request("GET", f"{url}?offset={token}", headers)


def _protocol(headers: Headers) -> dict[str, str | None]:
    return {name: headers.get(name) for name in PROTOCOL_HEADERS}


def _catchup(other: Node) -> dict[str, int]:
    return readiness(other.url)["checks"]["catchup"]  # type: ignore[index,no-any-return]


def _stream(pair: tuple[Node, Node], content_type: str, chunks: list[bytes]) -> tuple[str, dict[str, str]]:
    """A stream in ``BUCKET`` with ``chunks`` appended through the owner; its path and a reader's credential."""
    owner, _ = pair
    path = f"/v1/buckets/{BUCKET}/stream/{unique('cu')}"
    status, _, body = request("PUT", owner.url + path, {**OPERATOR, "Content-Type": content_type})
    assert status == 201, body
    for chunk in chunks:
        status, _, body = request("POST", owner.url + path, {**OPERATOR, "Content-Type": content_type}, chunk)
        assert status == 204, body
    return path, bearer(owner.jwt(f"tiered:{BUCKET}:read"))


def _wait_cold(other: Node, path: str, reader: dict[str, str]) -> None:
    """Until a read at offset 0 through the non-owner is answered from the store (bounded)."""
    deadline = time.monotonic() + scaled(30)
    while time.monotonic() < deadline:
        status, headers, body = _get(other.url + path, 0, reader)
        assert status == 200, body
        if headers.get("Tiered-Served-By") == "n2":
            return
        time.sleep(0.2)
    raise AssertionError("the stream's bytes never reached the cold tier")


def _walk(url: str, reader: dict[str, str]) -> list[tuple[int, int, Headers, bytes]]:
    """Every chunk of the stream from offset 0, following Stream-Next-Offset: (offset, status, headers, body)."""
    out = []
    offset = format_offset(0)
    for _ in range(1000):
        status, headers, body = _get(url, offset, reader)
        at = parse_offset(offset)
        assert at is not None
        out.append((at, status, headers, body))
        assert status == 200, body
        if headers.get("Stream-Up-To-Date") == "true":
            return out
        offset = headers["Stream-Next-Offset"]
    raise AssertionError("the stream never ended")


def test_a_catch_up_read_through_the_non_owner_is_the_owners_answer_from_the_store(
    pair: tuple[Node, Node],
) -> None:
    owner, other = pair
    assert owner.proc is not None
    binary = [os.urandom(1500 + 97 * i) for i in range(12)]
    messages = [json.dumps({"i": i, "pad": "x" * (i * 7 % 300)}).encode() for i in range(120)]
    streams = [
        (*_stream(pair, "application/octet-stream", binary), b"".join(binary)),
        (*_stream(pair, "application/json", [b"[" + b",".join(messages[i : i + 10]) + b"]" for i in range(0, 120, 10)]), None),
    ]  # fmt: skip
    for path, reader, _ in streams:
        _wait_cold(other, path, reader)
    expected: dict[str, list[tuple[int, int, Headers, bytes]]] = {}
    for path, reader, data in streams:
        walked = expected[path] = _walk(owner.url + path, reader)
        assert len(walked) > 3
        if data is not None:
            assert b"".join(body for *_, body in walked) == data
        else:
            assert [m for *_, body in walked for m in json.loads(body)] == [json.loads(m) for m in messages]
        for offset, status, headers, body in walked:
            got_status, got_headers, got_body = _get(other.url + path, offset, reader)
            assert (got_status, got_body) == (status, body)
            assert _protocol(got_headers) == _protocol(headers)  # Stream-Record among them (issue 22)
            assert headers.get("Stream-Record") is not None
            last = headers.get("Stream-Up-To-Date") == "true"
            # Every answer that lies wholly below the cold frontier came from the store, not the owner.
            assert got_headers.get("Tiered-Served-By") == (None if last else "n2"), offset
            assert headers.get("Tiered-Served-By") is None
            # A conditional read revalidates the same way.
            if not last:
                etag = headers["ETag"]
                assert _get(other.url + path, offset, {**reader, "If-None-Match": etag})[0] == 304

        # A read from the retained start (-1, or no offset) too.
        for query in ("?offset=-1", ""):
            want = request("GET", owner.url + path + query, reader)
            got = request("GET", other.url + path + query, reader)
            assert (got[0], got[2], _protocol(got[1])) == (want[0], want[2], _protocol(want[1]))
            assert got[1].get("Tiered-Served-By") == "n2" and got[2] == walked[0][3]

    # Locators fresh (fetched just now), the owner paused: the cold answers need nothing from it.
    time.sleep(LOCATOR_TTL + 0.2)
    for path, reader, _ in streams:
        assert _get(other.url + path, 0, reader)[2] == expected[path][0][3]
    before = _catchup(other)
    os.killpg(owner.proc.pid, signal.SIGSTOP)
    try:
        for path, reader, _ in streams:
            for offset, status, headers, body in expected[path][:-1]:
                got_status, got_headers, got_body = _get(other.url + path, offset, reader)
                assert (got_status, got_body) == (status, body)
                assert _protocol(got_headers) == _protocol(headers)
    finally:
        os.killpg(owner.proc.pid, signal.SIGCONT)
    after = _catchup(other)
    assert after["locators"] == before["locators"]
    assert after["served"] == before["served"] + sum(len(expected[p]) - 1 for p, _, _ in streams)


def test_a_locator_is_not_used_after_its_validity(pair: tuple[Node, Node]) -> None:
    owner, other = pair
    path, reader = _stream(pair, "application/octet-stream", [os.urandom(3000) for _ in range(4)])
    _wait_cold(other, path, reader)
    fetched = _catchup(other)["locators"]
    # Within its validity the locator serves (the owner is not asked again) ...
    status, headers, _ = _get(other.url + path, 0, reader)
    assert status == 200 and headers.get("Tiered-Served-By") == "n2"
    assert _catchup(other)["locators"] == fetched
    # ... after it, the owner is asked again.
    time.sleep(LOCATOR_TTL + 0.2)
    status, headers, _ = _get(other.url + path, 0, reader)
    assert status == 200 and headers.get("Tiered-Served-By") == "n2"
    assert _catchup(other)["locators"] == fetched + 1
    # The stream deleted on its owner: once the locator expired, the non-owner answers as the owner does.
    assert request("DELETE", owner.url + path, OPERATOR)[0] == 204
    time.sleep(LOCATOR_TTL + 0.2)
    assert _get(owner.url + path, 0, reader)[0] == 404
    status, headers, _ = _get(other.url + path, 0, reader)
    assert status == 404 and headers.get("Tiered-Served-By") is None


def test_a_stream_created_again_through_the_non_owner_never_reuses_an_offset(pair: tuple[Node, Node]) -> None:
    """Delete and create again through the node that does not own the shard: the owner starts the new
    stream above the old offsets; the non-owner's locators of the old stream cover only old offsets, so
    old offsets get the owner's 410 (once the old locator expired) and never the new stream's bytes."""
    owner, other = pair
    path = f"/v1/buckets/{BUCKET}/stream/{unique('again')}"
    octet = {**OPERATOR, "Content-Type": "application/octet-stream"}
    old_bytes = [os.urandom(3000) for _ in range(4)]
    assert request("PUT", other.url + path, octet)[0] == 201
    for chunk in old_bytes:
        assert request("POST", other.url + path, octet, chunk)[0] == 204
    reader = bearer(owner.jwt(f"tiered:{BUCKET}:read"))
    _wait_cold(other, path, reader)  # the non-owner now holds a locator of the first stream
    old = [0, CHUNK, 12000]

    assert request("DELETE", other.url + path, OPERATOR)[0] == 204
    new_bytes = [os.urandom(3000) for _ in range(4)]
    status, headers, body = request("PUT", other.url + path, octet, new_bytes[0])
    assert status == 201, body
    first = 12001  # the path's second stream starts above the first one's 0..12000
    assert headers["Stream-Next-Offset"] == format_offset(first + 3000)
    for chunk in new_bytes[1:]:
        assert request("POST", other.url + path, octet, chunk)[0] == 204
    status, headers, _ = request("HEAD", other.url + path, reader)
    assert status == 200 and headers["Stream-Retained-Offset"] == format_offset(first)
    assert headers["Stream-Next-Offset"] == format_offset(first + 12000)

    # Before the old locator expires, an old offset may still get the old stream's bytes (a cache, as
    # documented); never the new stream's.
    new_data = b"".join(new_bytes)
    for offset in old:
        status, _, body = _get(other.url + path, offset, reader)
        assert status == 410 or (status == 200 and body == b"".join(old_bytes)[offset : offset + CHUNK])
        assert new_data[:64] not in body
    time.sleep(LOCATOR_TTL + 0.2)
    for offset in old:
        for url in (owner.url, other.url):
            status, headers, body = _get(url + path, offset, reader)
            assert status == 410, (url, offset, body)
            assert json.loads(body)["error"]["code"] == "OFFSET_GONE"
            assert headers["Stream-Next-Offset"] == format_offset(first)
    # The new stream reads from its own offsets through the non-owner, from the store once cold.
    deadline = time.monotonic() + 30
    while True:
        status, headers, body = _get(other.url + path, first, reader)
        assert status == 200 and body == new_data[:CHUNK], body[:100]
        if headers.get("Tiered-Served-By") == "n2" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert headers.get("Tiered-Served-By") == "n2"
    status, _, body = request("GET", f"{other.url}{path}?offset=-1", reader)
    assert status == 200 and body == new_data[:CHUNK]


def test_unauthorized_catch_up_reads_are_refused_as_the_owner_refuses_them(pair: tuple[Node, Node]) -> None:
    owner, other = pair
    path, reader = _stream(pair, "application/octet-stream", [os.urandom(3000) for _ in range(4)])
    _wait_cold(other, path, reader)  # a locator for this reader is cached on the non-owner now
    callers = {
        "none": {},
        "forged": bearer(owner.jwt(f"tiered:{BUCKET}:read", key=_other_key())),
        "expired": bearer(owner.jwt(f"tiered:{BUCKET}:read", exp=int(time.time()) - 60)),
        "other bucket": bearer(owner.jwt("tiered:elsewhere:read")),
        "unknown token": bearer("tdt_" + "0" * 40),
    }
    statuses = {}
    for name, headers in callers.items():
        want = _get(owner.url + path, 0, headers)
        got = _get(other.url + path, 0, headers)
        assert (got[0], got[2]) == (want[0], want[2]), name
        assert got[1].get("Tiered-Served-By") is None
        statuses[name] = got[0]
    assert statuses == {"none": 401, "forged": 401, "expired": 401, "other bucket": 404, "unknown token": 401}
    # The authorized reader still reads from the store.
    status, headers, _ = _get(other.url + path, 0, reader)
    assert status == 200 and headers.get("Tiered-Served-By") == "n2"


def test_a_locator_is_not_used_past_the_credentials_expiry(pair: tuple[Node, Node]) -> None:
    owner, other = pair
    path, reader = _stream(pair, "application/octet-stream", [os.urandom(3000) for _ in range(4)])
    _wait_cold(other, path, reader)
    # A JWT (exp in whole seconds) expiring 1-1.5 s from now: its locator would be good for LOCATOR_TTL.
    time.sleep((0.5 - time.time() % 1) % 1)
    exp = int(time.time()) + 2
    short = bearer(owner.jwt(f"tiered:{BUCKET}:read", exp=exp))
    status, headers, _ = _get(other.url + path, 0, short)
    assert status == 200 and headers.get("Tiered-Served-By") == "n2"  # cached for this credential
    time.sleep(max(0.0, exp - time.time()) + 0.3)  # expired, well within LOCATOR_TTL of the locator
    assert _get(owner.url + path, 0, short)[0] == 401
    status, headers, _ = _get(other.url + path, 0, short)
    assert status == 401 and headers.get("Tiered-Served-By") is None


def test_a_flipped_byte_in_the_cold_object_is_an_integrity_error_through_the_non_owner(
    pair: tuple[Node, Node], moto_s3: S3Endpoint
) -> None:
    owner, other = pair
    path, reader = _stream(pair, "application/octet-stream", [os.urandom(3000) for _ in range(4)])
    # The owner's locator says where the stream's first bytes are (asked for directly: it is harmless).
    deadline = time.monotonic() + scaled(30)
    while True:
        status, headers, body = _get(owner.url + path, 0, {**reader, LOCATOR_HEADER: "1"})
        assert status == 200
        if headers.get(LOCATOR_HEADER) == "1" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    locator = decode_locator(body)
    piece = locator.pieces[0]
    index: ChunkIndex = piece.index
    group = index.row_groups[index.streams[0].ranges[0].row_group]
    s3 = boto3.client("s3", endpoint_url=moto_s3.url, region_name=moto_s3.region)
    listed = s3.list_objects_v2(Bucket=moto_s3.bucket, Prefix=f"{_prefix_of(owner)}/shards/")
    keys = [o["Key"] for o in listed.get("Contents", []) if o["Key"].endswith("/" + piece.key)]
    assert len(keys) == 1, keys
    data = bytearray(s3.get_object(Bucket=moto_s3.bucket, Key=keys[0])["Body"].read())
    data[group.offset + group.length // 2] ^= 0x01
    s3.put_object(Bucket=moto_s3.bucket, Key=keys[0], Body=bytes(data))

    status, headers, body = _get(other.url + path, 0, reader)
    assert status == 502, body
    assert b"DATA_DAMAGED" in body and headers.get("Tiered-Served-By") is None
    assert _get(owner.url + path, 0, reader)[0] == 502  # the owner says the same
    assert _catchup(other)["integrity_errors"] >= 1


def test_object_store_durability_any_node_serves_the_others_cold_reads(
    moto_s3: S3Endpoint, tmp_path: Path
) -> None:
    """Shards spread over both nodes (object-store durability rebalances): each serves the other's streams."""
    extra = (
        "--flush-interval-s", "0.2", "--flush-bytes", "1024", "--hot-retention-s", "0",
        "--read-chunk-bytes", str(CHUNK),
    )  # fmt: skip
    with start_nodes(
        tmp_path, moto_s3, unique_prefix("catchup-os"), ("n1", "n2"), shards=2, ttl_s=TTL, durability="object-store", extra=extra
    ) as started:  # fmt: skip
        nodes = list(started.values())
        served = wait_served(nodes, 2, 30, every_node=True)
        assert all(served) and not served[0] & served[1], served
        streams: dict[int, str] = {}  # the owner's index -> a stream of a shard it serves
        for _ in range(64):
            name = unique("os")
            owner = 0 if shard_of(DEFAULT_BUCKET, name, 2) in served[0] else 1
            streams.setdefault(owner, name)
            if len(streams) == 2:
                break
        payload = {i: os.urandom(3 * CHUNK + 123) for i in streams}
        for i, name in streams.items():
            url = f"{nodes[i].url}/v1/stream/{name}"
            assert request("PUT", url, {"Content-Type": "application/octet-stream"})[0] == 201
            assert request("POST", url, {"Content-Type": "application/octet-stream"}, payload[i])[0] == 204
        for i, name in streams.items():
            owner, other = nodes[i], nodes[1 - i]
            deadline = time.monotonic() + scaled(30)
            while True:
                status, headers, body = _get(f"{other.url}/v1/stream/{name}", 0, {})
                if headers.get("Tiered-Served-By") or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert status == 200 and headers.get("Tiered-Served-By") == f"n{2 - i}", headers
            want = _get(f"{owner.url}/v1/stream/{name}", 0, {})
            assert (status, body, _protocol(headers)) == (want[0], want[2], _protocol(want[1]))
            assert body == payload[i][:CHUNK]


def _other_key() -> Any:
    from joserfc.jwk import RSAKey

    return RSAKey.generate_key(2048, parameters={"kid": "test-1"})


def _prefix_of(node: Node) -> str:
    args = node.args
    return args[args.index("--s3-prefix") + 1]
