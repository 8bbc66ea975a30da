"""Stream snapshots through a cluster: published and read through the owner and a non-owner node alike,
and still there, byte-exact, after the owner is SIGKILLed and another node takes its shard over.

The snapshot requests are requests to the stream's URL, so the route table's stream rows key them by
(bucket, stream) and shard routing sends them to the stream's owner, whichever node they reach.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster_support import serving, start_nodes, unique_prefix, wait_served
from tests.support.deadlines import wait_for
from tests.support.http_helpers import Headers, append, create, head, read, request, stream_url, unique
from tests.support.s3_server import S3Endpoint
from tests.support.server_process import ServerProcess
from tiered.cluster.membership.shards import shard_of
from tiered.core.ids import DEFAULT_BUCKET

pytestmark = pytest.mark.timeout(180)

SHARDS = 4


@pytest.fixture
def pair(moto_s3: S3Endpoint, tmp_path: Path) -> Iterator[list[ServerProcess]]:
    with start_nodes(
        tmp_path, moto_s3, unique_prefix("snap"), ("n1", "n2"), shards=SHARDS, ttl_s=1.5,
        durability="object-store", wal_interval_ms=5,
    ) as started:  # fmt: skip
        nodes = list(started.values())
        served = wait_served(nodes, SHARDS, 30, every_node=True)
        assert all(served), served
        yield nodes


def name_owned_by(node: ServerProcess) -> str:
    owned = serving(node)
    for _ in range(1000):
        name = unique("snap")
        if shard_of(DEFAULT_BUCKET, name, SHARDS) in owned:
            return name
    raise AssertionError(f"no name hashes to a shard of {node.url} ({owned})")


def bootstrap_parts(url: str) -> tuple[Headers, bytes]:
    status, headers, body = request("GET", url + "?bootstrap")
    assert status == 200, body
    return headers, body


def test_owner_and_non_owner_serve_snapshots_and_a_takeover_keeps_them(pair: list[ServerProcess]) -> None:
    owner, other = pair
    name = name_owned_by(owner)
    via_owner, via_other = stream_url(owner.url, name), stream_url(other.url, name)
    assert create(via_other, "application/json", b'[{"n":1},{"n":2}]')[0] == 201
    mid = head(via_other)[1]["Stream-Next-Offset"]
    end = append(via_owner, b'{"n":3}', "application/json")[1]["Stream-Next-Offset"]
    # Published through the node that does not own the stream.
    status, headers, body = request(
        "PUT", f"{via_other}?snapshot={mid}", {"Content-Type": "application/json"}, b'{"sum":3}'
    )
    assert status == 204, body
    etag = headers["ETag"]
    # The same publish through the owner: idempotent; another body: 409, whichever node.
    status, headers, _ = request(
        "PUT", f"{via_owner}?snapshot={mid}", {"Content-Type": "application/json"}, b'{"sum":3}'
    )
    assert (status, headers["ETag"]) == (204, etag)
    status, _, body = request(
        "PUT", f"{via_other}?snapshot={mid}", {"Content-Type": "application/json"}, b"{}"
    )
    assert status == 409 and json.loads(body)["error"]["code"] == "SNAPSHOT_CONFLICT"

    def everything_readable(url: str) -> None:
        status, headers, _ = read(url, "snapshot")
        assert status == 307 and headers["Location"].endswith(f"?offset={mid}_snapshot"), (status, headers)
        status, headers, body = read(url, f"{mid}_snapshot")
        assert (status, body, headers["Stream-Next-Offset"]) == (200, b'{"sum":3}', mid)
        assert head(url)[1]["Stream-Snapshot-Offset"] == mid
        headers, body = bootstrap_parts(url)
        assert headers["Stream-Snapshot-Offset"] == mid and headers["Stream-Next-Offset"] == end
        assert b'{"sum":3}' in body and b'[{"n":3}]' in body and b'"n":1' not in body

    for url in (via_owner, via_other):
        everything_readable(url)
    # Retention to the snapshot through the non-owner; a 410 points at the snapshot on both.
    status, _, _ = request("PUT", f"{via_other}?snapshot={end}", {"Stream-Snapshot-Retain": "true"}, b"S2")
    assert status == 204
    for url in (via_owner, via_other):
        status, headers, _ = read(url, mid)
        assert status == 410 and headers["Stream-Snapshot-Offset"] == end

    # The owner dies; the other node takes its shards over and serves the snapshot from the store.
    owner.kill()
    wait_for(lambda: serving(other) == set(range(SHARDS)), 60, "the survivor to take every shard over")
    status, headers, body = read(via_other, f"{end}_snapshot")
    assert (status, body) == (200, b"S2"), body
    headers, body = bootstrap_parts(via_other)
    assert headers["Stream-Snapshot-Offset"] == end and headers["Stream-Up-To-Date"] == "true"
