"""SIGKILL of an owner after a long run: the new owner restores from checkpoint objects and a bounded tail.

Two ``tiered serve`` nodes, object-store durability, on moto; a 5 ms WAL
interval, 1 MiB segments flushed at once (no hot retention) and a restore
bound of 4 objects, so a run of about a thousand acknowledged appends
through the owner is about a thousand WAL objects and hundreds of
checkpoints. Then the owner is SIGKILLed: every acknowledged append is read
back byte-exact through the survivor, and its restore of each shard read at
most the bound's WAL objects besides checkpoint objects (its ``/metrics``).
"""

from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path

import boto3
import pytest

from tests.support.cluster_support import serving, start_nodes, unique_prefix, wait_placed
from tests.support.deadlines import scaled
from tests.support.http_helpers import append, create, read_all, stream_url
from tests.support.s3_server import S3Endpoint
from tiered.cluster.membership import keys
from tiered.cluster.membership.shards import shard_of
from tiered.core.ids import DEFAULT_BUCKET

pytestmark = pytest.mark.timeout(400)

SHARDS = 4
BOUND = 4
APPENDS = 500


def names_in(shards: set[int], count: int) -> list[str]:
    """``count`` stream names, each in a different one of ``shards``."""
    out: dict[int, str] = {}
    i = 0
    while len(out) < min(count, len(shards)):
        name = f"long-{i}"
        shard = shard_of(DEFAULT_BUCKET, name, SHARDS)
        if shard in shards:
            out.setdefault(shard, name)
        i += 1
    return list(out.values())


def chain_tip(s3: S3Endpoint, prefix: str, shard: int) -> int:
    client = boto3.client("s3", endpoint_url=s3.url, region_name=s3.region)
    listed = client.list_objects_v2(Bucket=s3.bucket, Prefix=f"{prefix}/{keys.manifest_prefix(shard)}")
    seqs = [keys.seq_of_manifest_key(o["Key"].split(f"{prefix}/", 1)[1]) for o in listed.get("Contents", [])]
    return max((s for s in seqs if s is not None), default=0)


def read_back(url: str) -> bytes:
    """The whole stream, asked again while the store is too slow to answer (503, bounded)."""
    deadline = time.monotonic() + scaled(60)
    while True:
        try:
            return read_all(url)[0]
        except AssertionError as exc:
            if "503" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def restore_objects(url: str) -> dict[str, float]:
    """``tiered_cluster_restore_objects{kind="wal"}`` on a node, by shard."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("tiered_cluster_restore_objects{") and 'kind="wal"' in line:
            shard = line.split('shard="', 1)[1].split('"', 1)[0]
            out[shard] = float(line.rsplit(" ", 1)[1])
    return out


def test_sigkill_after_a_long_run_restores_every_acknowledged_append_from_a_bounded_set(
    moto_s3: S3Endpoint, tmp_path: Path
) -> None:
    prefix = unique_prefix("ckpt")
    extra = (
        "--cluster-checkpoint-max-objects", str(BOUND),
        "--segment-bytes", str(1 << 20), "--max-body-bytes", str(1 << 16),
        "--hot-retention-s", "0", "--flush-interval-s", "0.5",
    )  # fmt: skip
    with start_nodes(
        tmp_path, moto_s3, prefix, ("n1", "n2"), shards=SHARDS, ttl_s=1.5, durability="object-store",
        wal_interval_ms=5, extra=extra,
    ) as nodes:  # fmt: skip
        wait_placed(nodes, SHARDS, 30)
        owner, survivor = nodes["n1"], nodes["n2"]
        names = names_in(serving(owner), 2)
        assert len(names) == 2
        for name in names:
            assert create(stream_url(owner.url, name))[0] == 201
        acknowledged: dict[str, list[bytes]] = {name: [] for name in names}

        def writer(name: str) -> None:
            url = stream_url(owner.url, name)
            for seq in range(APPENDS):
                body = (b"%s:%06d;" % (name.encode(), seq)) * 100
                deadline = time.monotonic() + scaled(30)
                while True:  # the same producer seq again until acknowledged: exactly once
                    status, _, _ = append(
                        url, body, Producer_Id="p", Producer_Epoch="0", Producer_Seq=str(seq)
                    )
                    if status in (200, 204):
                        acknowledged[name].append(body)
                        break
                    assert time.monotonic() < deadline, status
                    time.sleep(0.05)

        threads = [threading.Thread(target=writer, args=(name,)) for name in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        shards = {shard_of(DEFAULT_BUCKET, name, SHARDS) for name in names}
        tips = {shard: chain_tip(moto_s3, prefix, shard) for shard in shards}
        assert sum(tips.values()) >= APPENDS, tips  # about one ship (one WAL object) per append
        owner.kill()
        deadline = time.monotonic() + scaled(60)
        while time.monotonic() < deadline and not shards <= serving(survivor):
            time.sleep(0.2)
        assert shards <= serving(survivor)
        for name in names:
            assert read_back(stream_url(survivor.url, name)) == b"".join(acknowledged[name]), name
        read = restore_objects(survivor.url)
        for shard in shards:
            assert read[f"{shard:04d}"] <= BOUND, (shard, read, tips)
