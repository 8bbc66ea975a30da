"""Streams keyed by header through a cluster (issue 21): ``Stream-Key`` appends and ``?key=`` reads give the
same answers through the stream's owner and through a node that does not own it, before compaction,
after the owner's compactor wrote the key index (``POST /v1/admin/gc`` runs a pass on every shard), and
after new appends and a tombstone sent through the non-owner.

A ``?key=`` read never answers from cold locators on a non-owner (the index is the owner's): it is
forwarded, so the two nodes cannot disagree.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster_support import cluster_env, serving, start_nodes, unique_prefix, wait_served
from tests.support.deadlines import wait_for
from tests.support.http_helpers import request, stream_url, unique
from tests.support.s3_server import S3Endpoint
from tests.support.server_process import ServerProcess
from tiered.cluster.membership.shards import shard_of
from tiered.core.ids import DEFAULT_BUCKET

pytestmark = pytest.mark.timeout(180)

SHARDS = 4
TOKEN = "header-keys-admin-token-0123456789"


@pytest.fixture
def pair(moto_s3: S3Endpoint, tmp_path: Path) -> Iterator[list[ServerProcess]]:
    with start_nodes(
        tmp_path, moto_s3, unique_prefix("hkeys"), ("n1", "n2"), shards=SHARDS, ttl_s=1.5,
        durability="object-store", wal_interval_ms=5, env={**cluster_env(), "TIERED_ADMIN_TOKEN": TOKEN},
    ) as started:  # fmt: skip
        nodes = list(started.values())
        served = wait_served(nodes, SHARDS, 30, every_node=True)
        assert all(served), served
        yield nodes


def name_owned_by(node: ServerProcess) -> str:
    owned = serving(node)
    for _ in range(1000):
        name = unique("hk")
        if shard_of(DEFAULT_BUCKET, name, SHARDS) in owned:
            return name
    raise AssertionError(f"no name hashes to a shard of {node.url} ({owned})")


def keyed_append(url: str, key: str, body: bytes, tombstone: bool = False) -> int:
    headers = {"Content-Type": "text/plain", "Stream-Key": key}
    if tombstone:
        headers["Stream-Key-Tombstone"] = "true"
    status, _, out = request("POST", url, headers, body)
    assert status == 204, out
    return status


def key_read(url: str, key: str) -> tuple[int, bytes, str | None]:
    status, headers, body = request("GET", f"{url}?key={key}")
    return status, body, headers.get("Stream-Key-Offset")


def test_owner_and_non_owner_answer_key_reads_alike_and_a_takeover_keeps_them(
    pair: list[ServerProcess],
) -> None:
    owner, other = pair
    name = name_owned_by(owner)
    via_owner, via_other = stream_url(owner.url, name), stream_url(other.url, name)
    status, _, body = request(
        "PUT", via_other, {"Content-Type": "text/plain", "Stream-Compaction-Key": "header"}, b""
    )
    assert status == 201, body
    keyed_append(via_other, "a", b"a1;")
    keyed_append(via_owner, "b", b"b1;")
    keyed_append(via_other, "a", b"a2;")
    status, _, out = request("POST", via_other, {"Content-Type": "text/plain"}, b"no key")
    assert (status, json.loads(out)["error"]["code"]) == (400, "STREAM_KEY_REQUIRED")

    def same_answers(expected: dict[str, tuple[int, bytes | None]]) -> None:
        for key, (want_status, want_body) in expected.items():
            answers = {key_read(url, key) for url in (via_owner, via_other)}
            assert len(answers) == 1, (key, answers)
            [(status, body, _)] = answers
            assert status == want_status, (key, body)
            if want_body is not None:
                assert body == want_body

    same_answers({"a": (200, b"a2;"), "b": (200, b"b1;"), "c": (404, None)})

    def compacted() -> bool:
        status, _, out = request(
            "POST", f"{other.url}/v1/admin/gc", {"Authorization": f"Bearer {TOKEN}"}, b"", timeout=30
        )
        assert status == 200, out
        report = json.loads(out)
        assert report["errors"] == [], report
        # Done once a1 is gone: the flusher may have moved the appends to the cold tier in two passes.
        return request("GET", f"{via_owner}?offset=-1")[2] == b"b1;a2;"

    wait_for(compacted, 30, "the owner's compactor to fold every append into the key index", interval=0.5)
    same_answers({"a": (200, b"a2;"), "b": (200, b"b1;"), "c": (404, None)})
    for url in (via_owner, via_other):
        status, headers, body = request("GET", f"{url}?offset=-1")
        assert (status, body) == (200, b"b1;a2;")  # a1 is a hole now, whichever node reads
    keyed_append(via_other, "b", b"b2;")
    keyed_append(via_other, "a", b"", tombstone=True)
    same_answers({"a": (404, None), "b": (200, b"b2;")})
    offsets = {key_read(url, "a")[2] for url in (via_owner, via_other)}
    assert len(offsets) == 1 and None not in offsets  # the tombstone's offset, on both

    # The owner dies (SIGKILL); the survivor takes its shards over (its journal from the WAL in the store)
    # and answers the same: the index object, the pending keys and the holes all came with the shard.
    owner.kill()
    wait_for(lambda: serving(other) == set(range(SHARDS)), 60, "the survivor to take every shard over")
    status, body, _ = key_read(via_other, "b")
    assert (status, body) == (200, b"b2;")
    status, _, offset = key_read(via_other, "a")
    assert status == 404 and offsets == {offset}
    status, _, body = request("GET", f"{via_other}?offset=-1")
    assert (status, body) == (200, b"b1;a2;b2;")


def test_a_key_read_is_never_served_from_cold_locators() -> None:
    """A non-owner serves catch-up reads from the owner's cold locators; a ``?key=`` read needs the owner's
    key index and pending keys, so it is always forwarded (a read by offset still may use locators)."""
    from tiered.cluster.gateway.catchup import RETAINED_START, catchup_offset

    assert catchup_offset("GET", {"key": "a"}, marked=False) is None
    assert catchup_offset("GET", {"key": "7", "offset": "-1"}, marked=False) is None
    assert catchup_offset("GET", {}, marked=False) == RETAINED_START
