"""Forks across shards on a three-node object-store cluster (``tiered/cluster/features/xfork.py``).

The source lives in a shard one node owns, the fork in a shard another node
owns, and the client talks to the third: the fork's owner pins the source
through forwarding and stores a copy of the inherited bytes at the same
offsets. Asserted: byte-exact reads from every node (binary, across message
boundaries, and JSON), independence from later source appends, the
single-node soft-delete semantics through the pin (410 while the fork lives,
404 once it is deleted), and that the fork still reads byte-exact right after
the source's owner was SIGKILLed (the copy is durable in the fork's own shard).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster_support import (
    serving,
    start_node,
    start_nodes,
    unique_prefix,
    wait_every_shard_reachable,
    wait_served,
)
from tests.support.deadlines import scaled
from tests.support.http_helpers import append, create, head, read_all, request, stream_url, unique
from tests.support.s3_server import S3Endpoint
from tests.support.server_process import ServerProcess
from tests.support.state_fingerprint import fingerprint
from tiered.cluster.features.xfork import PIN_PREFIX, pin_name, pinned_fork
from tiered.cluster.membership.shards import shard_of
from tiered.core.errors import ErrorCode, TieredError
from tiered.core.ids import DEFAULT_BUCKET, format_offset
from tiered.engine.codec import decode_record, encode_record
from tiered.engine.snapshot import decode_snapshot, encode_snapshot
from tiered.engine.streams.model import CreateRequest, ForkCopy, ForkRequest
from tiered.engine.streams.state import StreamState
from tiered.hot.log import LogPosition

pytestmark = pytest.mark.timeout(120)

SHARDS = 8


def _trio(moto_s3: S3Endpoint, tmp_path: Path, ttl_s: float) -> Iterator[list[ServerProcess]]:
    with start_nodes(
        tmp_path, moto_s3, unique_prefix("xfork"), shards=SHARDS, ttl_s=ttl_s, durability="object-store", wal_interval_ms=5
    ) as started:  # fmt: skip
        nodes = list(started.values())
        served = wait_served(nodes, SHARDS, 30, every_node=True)
        assert all(served), served
        yield nodes


@pytest.fixture
def trio(moto_s3: S3Endpoint, tmp_path: Path) -> Iterator[list[ServerProcess]]:
    yield from _trio(moto_s3, tmp_path, 4.0)


@pytest.fixture
def quick_trio(moto_s3: S3Endpoint, tmp_path: Path) -> Iterator[list[ServerProcess]]:
    """Lease TTL 1.5 s: a SIGKILLed node's shards are taken over within seconds."""
    yield from _trio(moto_s3, tmp_path, 1.5)


def name_owned_by(node: ServerProcess, prefix: str) -> str:
    """A fresh stream name in the default bucket whose shard ``node`` serves."""
    owned = serving(node)
    for _ in range(1000):
        name = unique(prefix)
        if shard_of(DEFAULT_BUCKET, name, SHARDS) in owned:
            return name
    raise AssertionError(f"no name hashes to a shard of {node.url} ({owned})")


def test_fork_of_another_nodes_shard_reads_byte_exact_and_survives_the_source_owner(
    trio: list[ServerProcess],
) -> None:
    source_owner, fork_owner, entry = trio
    src_name, fork_name = name_owned_by(source_owner, "src"), name_owned_by(fork_owner, "fork")
    src = stream_url(entry.url, src_name)
    pieces = [b"\x00first", b"second\xff", b"third-piece"]
    assert create(src, "application/octet-stream", pieces[0])[0] == 201
    for piece in pieces[1:]:
        assert append(src, piece)[0] == 204
    source_bytes = b"".join(pieces)
    fork_at = len(pieces[0]) + 3  # inside the second append: offsets, not messages, are the unit

    fork = stream_url(entry.url, fork_name)
    status, headers, body = create(
        fork,
        "application/octet-stream",
        Stream_Forked_From=f"/v1/stream/{src_name}",
        Stream_Fork_Offset=format_offset(fork_at),
    )
    assert status == 201, body
    assert headers["Stream-Next-Offset"] == format_offset(fork_at)
    assert append(src, b"after-the-fork")[0] == 204
    assert append(fork, b"+own")[0] == 204
    expected = source_bytes[:fork_at] + b"+own"
    for node in trio:
        data, _ = read_all(stream_url(node.url, fork_name))
        assert data == expected
        data, _ = read_all(stream_url(node.url, fork_name), format_offset(fork_at - 2))
        assert data == expected[fork_at - 2 :]  # identical offsets across the copied boundary

    # Re-creating the same fork is idempotent; another fork point on the same path conflicts.
    assert create(fork, None, Stream_Forked_From=f"/v1/stream/{src_name}", Stream_Fork_Offset=format_offset(fork_at))[0] == 200  # fmt: skip
    assert create(fork, None, Stream_Forked_From=f"/v1/stream/{src_name}", Stream_Fork_Offset=format_offset(1))[0] == 409  # fmt: skip

    # The source's owner dies: the fork reads on, from the nodes left, without waiting for a takeover.
    source_owner.kill()
    for node in (fork_owner, entry):
        data, _ = read_all(stream_url(node.url, fork_name))
        assert data == expected


def test_cross_shard_fork_keeps_single_node_delete_semantics_and_json_messages(
    trio: list[ServerProcess],
) -> None:
    source_owner, fork_owner, entry = trio
    src_name, fork_name = name_owned_by(source_owner, "jsrc"), name_owned_by(fork_owner, "jfork")
    src, fork = stream_url(entry.url, src_name), stream_url(entry.url, fork_name)
    assert create(src, "application/json", b'[{"a": 1}, "two, with a comma", [3]]')[0] == 201
    assert append(src, b'{"b": "\\n"}', "application/json")[0] == 204
    # Fork after the second message (a JSON sub-offset counts messages from the fork offset).
    status, _, body = create(
        fork, None, Stream_Forked_From=f"/v1/stream/{src_name}", Stream_Fork_Offset=format_offset(0),
        Stream_Fork_Sub_Offset="2",
    )  # fmt: skip
    assert status == 201, body
    assert head(fork)[1]["Content-Type"] == "application/json"
    assert append(fork, b'"mine"', "application/json")[0] == 204
    for node in trio:
        data, _ = read_all(stream_url(node.url, fork_name))
        assert json.loads(data) == [{"a": 1}, "two, with a comma", "mine"]

    # The fork pins its source: deleting the source soft-deletes it, as on one node.
    assert request("DELETE", src)[0] == 204
    assert head(src)[0] == 410
    assert create(src, "application/json")[0] == 409
    data, _ = read_all(fork)
    assert json.loads(data) == [{"a": 1}, "two, with a comma", "mine"]
    # Deleting the fork releases the pin: the soft-deleted source goes.
    assert request("DELETE", fork)[0] == 204
    assert head(fork)[0] == 404
    assert head(src)[0] == 404


def test_refused_cross_shard_forks_leave_no_pin(trio: list[ServerProcess]) -> None:
    source_owner, fork_owner, entry = trio
    src_name = name_owned_by(source_owner, "rsrc")
    src = stream_url(entry.url, src_name)
    assert create(src, "text/plain", b"data")[0] == 201
    missing = stream_url(entry.url, name_owned_by(fork_owner, "rfork"))
    assert create(missing, None, Stream_Forked_From="/v1/stream/no-such-source")[0] == 404
    mismatch = stream_url(entry.url, name_owned_by(fork_owner, "rfork"))
    assert create(mismatch, "application/json", Stream_Forked_From=f"/v1/stream/{src_name}")[0] == 409
    beyond = stream_url(entry.url, name_owned_by(fork_owner, "rfork"))
    status, _, _ = create(
        beyond, None, Stream_Forked_From=f"/v1/stream/{src_name}", Stream_Fork_Offset=format_offset(99)
    )
    assert status == 400
    taken = stream_url(entry.url, name_owned_by(fork_owner, "rfork"))
    assert create(taken, "text/plain", b"not a fork")[0] == 201
    assert create(taken, None, Stream_Forked_From=f"/v1/stream/{src_name}")[0] == 409
    for url in (missing, mismatch, beyond):
        assert head(url)[0] == 404
    # No refused fork took a reference: the source is deleted outright, not soft-deleted.
    assert request("DELETE", src)[0] == 204
    assert head(src)[0] == 404


def test_an_acknowledged_cross_shard_fork_survives_its_owners_sigkill(
    quick_trio: list[ServerProcess],
) -> None:
    """The copy is in the fork's create record: once acknowledged, it is in the store (object-store durability)."""
    source_owner, fork_owner, entry = quick_trio
    src_name, fork_name = name_owned_by(source_owner, "ksrc"), name_owned_by(fork_owner, "kfork")
    src, fork = stream_url(entry.url, src_name), stream_url(entry.url, fork_name)
    data = bytes(range(256)) * 40
    assert create(src, "application/octet-stream", data[:5000])[0] == 201
    assert append(src, data[5000:])[0] == 204
    assert create(fork, None, Stream_Forked_From=f"/v1/stream/{src_name}")[0] == 201
    fork_owner.kill()
    survivors = [source_owner, entry]
    fork_shard = shard_of(DEFAULT_BUCKET, fork_name, SHARDS)
    deadline = time.monotonic() + scaled(30)
    while time.monotonic() < deadline and not any(fork_shard in serving(n) for n in survivors):
        time.sleep(0.2)
    # The sibling of the new owner learns of it from the leases a beat later (503 until then, by design):
    # what is asked here is the data, once every survivor can reach it.
    wait_every_shard_reachable(survivors, seconds=30)
    for node in survivors:
        got, _ = read_all(stream_url(node.url, fork_name))
        assert got == data


def test_pin_names_hash_to_the_source_shard_and_name_the_fork() -> None:
    for count in (1, 8, 64):
        for shard in range(count):
            name = pin_name("default", "forks/f", "default", shard, count)
            assert name.startswith(PIN_PREFIX) and shard_of("default", name, count) == shard
            assert pin_name("default", "forks/f", "default", shard, count) == name  # stable: retries meet
            assert pinned_fork(name) == ("default", "forks/f")
    assert pinned_fork(pin_name("a-bucket", "x y/z", "default", 3, 8)) == ("a-bucket", "x y/z")
    long = pin_name("default", "p" * 1020, "default", 3, 8)  # too long to name the fork: a digest
    assert long.startswith(PIN_PREFIX + "#") and len(long) < 100 and pinned_fork(long) is None
    assert pinned_fork("events/x") is None


def test_a_copied_fork_is_a_plain_create_record_that_replays_and_snapshots_identically() -> None:
    """The copy needs no new record type: replay and a snapshot restore give the same state."""
    t0 = 1_700_000_000_000
    copy = ForkCopy(base=b"inherited", base_from=3, content_type="text/plain", ttl_s=None,
                    expires_at=None, expires_at_ms=None)  # fmt: skip
    fork = ForkRequest(source_uid=None, offset=12, spec="default/src@+0", copy=copy)
    live = StreamState()
    records, existing = live.decide_create(
        DEFAULT_BUCKET, "f", CreateRequest(None, None, None, None, False, b"own", fork), t0
    )
    assert existing is None and len(records) == 1
    record = records[0]
    assert (record.fork_source, record.fork_offset, record.fork_spec, record.data) == (
        None, 3, "default/src@+0", b"inheritedown",
    )  # fmt: skip
    live.apply(record, (1, 8))
    s = live.streams[record.uid]
    assert (s.content_type, s.retained_from, s.tail) == ("text/plain", 3, 15)
    replayed = StreamState()
    replayed.apply(decode_record(encode_record(record)), (1, 8))
    assert fingerprint(replayed) == fingerprint(live)
    restored, _ = decode_snapshot(encode_snapshot(live, LogPosition(1, 64)))
    assert fingerprint(restored) == fingerprint(live)
    # The same fork again matches (200); another fork point at the same path conflicts (409).
    again, existing = live.decide_create(
        DEFAULT_BUCKET, "f", CreateRequest(None, None, None, None, False, b"", ForkRequest(None, 0, "default/src@+0")), t0
    )  # fmt: skip
    assert again == [] and existing is s
    with pytest.raises(TieredError) as exc:
        live.decide_create(
            DEFAULT_BUCKET, "f", CreateRequest(None, None, None, None, False, b"", ForkRequest(None, 0, "default/src@+1")), t0
        )  # fmt: skip
    assert exc.value.code is ErrorCode.STREAM_EXISTS


@pytest.fixture
def sweeping(moto_s3: S3Endpoint, tmp_path: Path) -> Iterator[ServerProcess]:
    """One node serving every shard, sweeping pins older than 1 s every 0.3 s."""
    node = start_node(
        tmp_path, moto_s3, unique_prefix("pinsweep"), "n1", shards=SHARDS, ttl_s=4.0,
        extra=("--cluster-fork-pin-grace-s", "1", "--cluster-fork-pin-sweep-s", "0.3"),
    )  # fmt: skip
    try:
        yield node
    finally:
        node.stop()


def test_a_pin_whose_fork_is_gone_is_swept_and_a_live_forks_pin_is_kept(sweeping: ServerProcess) -> None:
    base = sweeping.url
    kept_src, orphan_src = unique("kept-src"), unique("orphan-src")
    for name in (kept_src, orphan_src):
        assert create(stream_url(base, name), "text/plain", b"data")[0] == 201
    # A live cross-shard fork of one source (a fork name in another shard than its source's).
    fork = next(n for n in (unique("fork") for _ in range(200)) if shard_of(DEFAULT_BUCKET, n, SHARDS) != shard_of(DEFAULT_BUCKET, kept_src, SHARDS))  # fmt: skip
    assert create(stream_url(base, fork), None, Stream_Forked_From=f"/v1/stream/{kept_src}")[0] == 201
    # A pin left behind by a fork that was never created (as after a crash between the two steps).
    orphan = pin_name(DEFAULT_BUCKET, unique("never-created"), DEFAULT_BUCKET, shard_of(DEFAULT_BUCKET, orphan_src, SHARDS), SHARDS)  # fmt: skip
    assert create(stream_url(base, orphan), None, Stream_Forked_From=f"/v1/stream/{orphan_src}")[0] == 201
    deadline = time.monotonic() + scaled(20)
    while time.monotonic() < deadline and head(stream_url(base, orphan))[0] != 404:
        time.sleep(0.2)
    assert head(stream_url(base, orphan))[0] == 404
    time.sleep(1.0)  # a few more passes: the live fork's pin is older than the grace by now
    # The orphan's source has no fork any more: deleted outright. The live fork still pins its source.
    assert request("DELETE", stream_url(base, orphan_src))[0] == 204
    assert head(stream_url(base, orphan_src))[0] == 404
    assert request("DELETE", stream_url(base, kept_src))[0] == 204
    assert head(stream_url(base, kept_src))[0] == 410
    data, _ = read_all(stream_url(base, fork))
    assert data == b"data"
