"""Large bodies stored by reference in a cluster (issue 22): appended through any node, read from any node.

Two nodes on moto: a body above the threshold (and above ``max_body_bytes``,
so it can only have been streamed) is appended through the node that does not
own the stream's shard: forwarding streams it on to the owner, which stores
it by reference in its shard's prefix. Both nodes read it back byte-exact.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster_support import serving, start_nodes, unique_prefix, wait_placed
from tests.support.http_helpers import append, create, read_all, request, stream_url, unique
from tests.support.s3_server import S3Endpoint
from tests.support.server_process import ServerProcess
from tiered.cluster.membership.shards import shard_of
from tiered.core.ids import DEFAULT_BUCKET

pytestmark = pytest.mark.timeout(180)

SHARDS = 4
THRESHOLD = 64 * 1024
MAX_BODY = 256 * 1024
EXTRA = (
    "--large-body-threshold-bytes", str(THRESHOLD),
    "--max-body-bytes", str(MAX_BODY),
    "--segment-bytes", str(1 << 20),
    "--read-chunk-bytes", str(100_000),
)  # fmt: skip


@pytest.fixture
def pair(moto_s3: S3Endpoint, tmp_path: Path) -> Iterator[list[ServerProcess]]:
    with start_nodes(
        tmp_path,
        moto_s3,
        unique_prefix("large"),
        ("n1", "n2"),
        shards=SHARDS,
        ttl_s=4.0,
        durability="object-store",
        wal_interval_ms=5,
        extra=EXTRA,
    ) as nodes:
        wait_placed(nodes, SHARDS, 60)
        yield list(nodes.values())


def name_not_owned_by(node: ServerProcess) -> str:
    owned = serving(node)
    for _ in range(1000):
        name = unique("large")
        if shard_of(DEFAULT_BUCKET, name, SHARDS) not in owned:
            return name
    raise AssertionError("every name hashes to this node's shards")


def test_a_large_body_appended_through_another_node_reads_back_byte_exact(pair: list[ServerProcess]) -> None:
    entry, other = pair
    name = name_not_owned_by(entry)
    url = stream_url(entry.url, name)
    assert create(url, "application/octet-stream", b"head;")[0] == 201
    big = os.urandom(3 * MAX_BODY + 5)
    headers = {"Content-Type": "application/octet-stream", "Producer-Id": "p", "Producer-Epoch": "0"}
    assert request("POST", url, {**headers, "Producer-Seq": "0"}, big)[0] == 200
    assert request("POST", url, {**headers, "Producer-Seq": "0"}, big)[0] == 204  # a retry: deduplicated
    assert append(url, b";tail")[0] == 204
    expected = b"head;" + big + b";tail"
    for node in pair:
        assert read_all(stream_url(node.url, name), "-1")[0] == expected
