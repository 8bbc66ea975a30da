"""The operator's takeover of a dead node's local-durability shard: it says what is lost, and asks first.

``tiered cluster take-over`` against moto: a chain whose last writer is the
dead node ``dead``, one cold object in the shard's prefix and, on the dead
node's volume, hot segments and a journal. A dry run and an unconfirmed run
print the loss and write nothing; a confirmed run writes the grant, which lets
``ShardHost.prepare`` on the named node (and no other) take the shard, only
while the chain still ends where it was granted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.cluster_support import cluster_args, serving, start_node, unique_prefix, wait_served
from tests.support.deadlines import scaled
from tests.support.http_helpers import create, read, request, unique
from tests.support.s3_server import S3Endpoint
from tests.support.server_process import ServerProcess
from tiered.cli.main import main
from tiered.cluster.membership import keys
from tiered.cluster.membership.cas import ObjectStoreCas
from tiered.cluster.membership.manifest import EntryKind, ManifestEntry, encode_entry
from tiered.cluster.membership.shards import shard_of
from tiered.cluster.shards.host import ShardHost
from tiered.cluster.shards.takeover import TakeoverGrant, decode_grant, encode_grant, grant_allows
from tiered.core.config import Config
from tiered.core.errors import TieredError
from tiered.core.ids import DEFAULT_BUCKET
from tiered.engine.engine import open_store

pytestmark = pytest.mark.timeout(60)

SHARD = 2
LAST = ManifestEntry(SHARD, 3, 4, EntryKind.FENCE, "dead", 1, "nonce")


def _config(s3: S3Endpoint, prefix: str, node: str, data_dir: Path) -> Config:
    return Config(
        data_dir=str(data_dir),
        cold_store="s3",
        s3_bucket=s3.bucket,
        s3_prefix=prefix,
        s3_endpoint=s3.url,
        s3_region=s3.region,
        s3_addressing_style="path",
        cluster_node_id=node,
    )


async def _seed(config: Config) -> None:
    store = await open_store(config, read_only=False, probe=False)
    try:
        await store.put(keys.manifest_key(SHARD, LAST.seq), encode_entry(LAST))
        await store.put(f"shards/{SHARD:04d}/data/01ARZ3NDEKTSV4RRFFQ69G5FAV.parquet", b"c" * 1234)
    finally:
        await store.close()


async def _grant(config: Config) -> bytes | None:
    store = await open_store(config, read_only=True, probe=False)
    try:
        return (
            await store.get(keys.takeover_key(SHARD)) if await store.head(keys.takeover_key(SHARD)) else None
        )
    finally:
        await store.close()


def test_take_over_states_the_loss_and_needs_the_confirmation(
    moto_s3: S3Endpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = unique_prefix("takeover")
    config = _config(moto_s3, prefix, "n2", tmp_path / "n2")
    asyncio.run(_seed(config))
    dead = tmp_path / "dead"
    (dead / "shards" / f"{SHARD:04d}" / "hot").mkdir(parents=True)
    (dead / "shards" / f"{SHARD:04d}" / "hot" / "00000001.seg").write_bytes(b"h" * 500)
    (dead / "shards" / f"{SHARD:04d}" / "journal").write_bytes(b"j" * 70)
    args = [
        "cluster", "take-over", "--shard", str(SHARD), "--to", "n2",
        *cluster_args(moto_s3, prefix, "n2"), "--data-dir", str(tmp_path / "n2"),
    ]  # fmt: skip

    assert main([*args, "--dead-data-dir", str(dead), "--dry-run"]) == 0
    said = capsys.readouterr().out
    assert "last written by node 'dead'" in said and "epoch 4, manifest position 3" in said
    assert "1 object(s), 1234 bytes" in said and f"{prefix}/shards/{SHARD:04d}/data/" in said
    assert "500 bytes in 1 hot segment file(s)" in said and "70 bytes of journal" in said
    assert "starts the shard EMPTY" in said and "dry run: nothing changed" in said
    assert asyncio.run(_grant(config)) is None

    assert main(args) == 1  # not confirmed; no volume given: the unflushed bytes are unknown
    said = capsys.readouterr().out
    assert "unknown: how many acknowledged bytes" in said and "refused: nothing changed" in said
    assert asyncio.run(_grant(config)) is None

    assert main([*args, "--yes-lose-unflushed-data"]) == 0
    assert "granted: shard 2" in capsys.readouterr().out
    data = asyncio.run(_grant(config))
    assert data is not None
    grant = decode_grant(data)
    assert (grant.from_writer, grant.at_seq, grant.at_epoch, grant.to) == ("dead", 3, 4, "n2")
    assert "starts the shard EMPTY" in grant.lost


def test_take_over_refuses_object_store_durability(
    moto_s3: S3Endpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = unique_prefix("takeover")
    args = cluster_args(moto_s3, prefix, "n2", durability="object-store")
    assert main(["cluster", "take-over", "--shard", "0", *args, "--data-dir", str(tmp_path)]) == 2
    assert "local durability" in capsys.readouterr().out


def test_a_grant_holds_only_for_its_node_and_its_chain_position() -> None:
    grant = TakeoverGrant(SHARD, "dead", 3, 4, "n2", "everything")
    assert grant_allows(grant, LAST, "n2")
    assert not grant_allows(grant, LAST, "n3")  # granted to n2 only
    assert grant_allows(TakeoverGrant(SHARD, "dead", 3, 4, "", "x"), LAST, "n3")  # any node
    assert not grant_allows(TakeoverGrant(SHARD, "dead", 3, 4, "", "x"), LAST, "dead")
    moved_on = ManifestEntry(SHARD, 4, 5, EntryKind.FENCE, "n2", 1, "n")
    assert not grant_allows(grant, moved_on, "n2")  # spent once the chain moved on
    assert not grant_allows(grant, None, "n2")


def test_prepare_takes_a_granted_shard_and_refuses_without_a_grant(
    moto_s3: S3Endpoint, tmp_path: Path
) -> None:
    prefix = unique_prefix("takeover")

    async def run() -> None:
        config = _config(moto_s3, prefix, "n2", tmp_path)
        store = await open_store(config, read_only=False, probe=False)
        try:
            cas = ObjectStoreCas(store)
            host = ShardHost(config, "n2", jobs=False, cas=cas)
            with pytest.raises(TieredError, match="last written by node dead"):
                await host.prepare(SHARD, 5, LAST)
            grant = TakeoverGrant(SHARD, "dead", 3, 4, "n2", "everything")
            await store.put(keys.takeover_key(SHARD), encode_grant(grant))
            await host.prepare(SHARD, 5, LAST)  # granted: no refusal
            other = ShardHost(config, "n3", jobs=False, cas=cas)
            with pytest.raises(TieredError):
                await other.prepare(SHARD, 5, LAST)
        finally:
            await store.close()

    asyncio.run(run())


# -- with running nodes ----------------------------------------------------------------------------

LIVE_TTL = 1.5
LIVE_ARGS = ("--gc-grace-s", "1", "--gc-interval-s", "1", "--reconcile-interval-s", "2")


async def _cold_objects(config: Config, shard: int) -> dict[str, int]:
    store = await open_store(config, read_only=True, probe=False)
    try:
        return {info.key: info.size async for info in store.list(f"shards/{shard:04d}/data/")}
    finally:
        await store.close()


def _wait(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + scaled(timeout)
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_take_over_with_running_nodes_starts_the_shard_empty_and_loses_what_it_said(
    moto_s3: S3Endpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two ``tiered serve`` nodes; n1, holding the stream's shard, is SIGKILLed; n2 refuses the shard
    (its data is on n1's volume) until the operator grants it; then n2 serves it empty, and the cold
    objects the command counted become orphans its GC deletes."""
    prefix = unique_prefix("takeover-live")
    kw: dict[str, object] = {"shards": 2, "ttl_s": LIVE_TTL, "durability": "local", "extra": LIVE_ARGS}
    n1 = start_node(tmp_path, moto_s3, prefix, "n1", **kw)
    n2: ServerProcess | None = None
    try:
        assert wait_served([n1], 2, 10 * LIVE_TTL) == [{0, 1}]  # the first node takes every shard
        n2 = start_node(tmp_path, moto_s3, prefix, "n2", **kw)
        stream = unique("takeover")
        shard = shard_of(DEFAULT_BUCKET, stream, 2)
        url = f"/v1/stream/{stream}"
        assert create(n2.url + url)[0] == 201  # forwarded to n1
        for i in range(5):
            status, _, _ = request(
                "POST", n1.url + url, {"Content-Type": "application/octet-stream"}, f"acked-{i};".encode()
            )
            assert status == 204
        config = _config(moto_s3, prefix, "n2", tmp_path / "operator")
        _wait("a flush to the cold tier", lambda: bool(asyncio.run(_cold_objects(config, shard))), 15)
        n1.kill()
        # n2 declares n1 dead but does not take its shards: their data is on n1's volume.
        time.sleep(3 * LIVE_TTL)
        assert shard not in serving(n2)
        assert read(n2.url + url, "-1")[0] == 503
        cold = asyncio.run(_cold_objects(config, shard))
        hot = [p for p in (tmp_path / "n1" / "shards" / f"{shard:04d}" / "hot").iterdir() if p.is_file()]
        hot_bytes = sum(p.stat().st_size for p in hot)
        argv = [
            "cluster",
            "take-over",
            "--shard",
            str(shard),
            "--to",
            "n2",
            "--dead-data-dir",
            str(tmp_path / "n1"),
        ]
        args = cluster_args(moto_s3, prefix, "n2", shards=2, ttl_s=LIVE_TTL)
        capsys.readouterr()
        assert (
            main([*argv, "--yes-lose-unflushed-data", *args, "--data-dir", str(tmp_path / "operator")]) == 0
        )
        said = capsys.readouterr().out
        assert f"holds {len(cold)} object(s), {sum(cold.values())} bytes" in said, said
        assert f"holds {hot_bytes} bytes in {len(hot)} hot segment file(s)" in said, said
        # n2 takes the granted shard (once its refusal's back-off ends) and serves it empty.
        _wait("n2 serving the granted shard", lambda: shard in serving(n2), 10 * LIVE_TTL)
        assert read(n2.url + url, "-1")[0] == 404, "the shard starts empty: the stream is lost, as stated"
        assert create(n2.url + url)[0] == 201
        status, _, _ = request("POST", n2.url + url, {"Content-Type": "application/octet-stream"}, b"after;")
        assert status == 204
        assert read(n2.url + url, "-1")[2] == b"after;"
        # The stated cold objects were orphans of the shard's prefix: the new owner's GC deletes them.
        _wait(
            "the lost cold objects deleted",
            lambda: not (asyncio.run(_cold_objects(config, shard)).keys() & cold.keys()),
            20,
        )
    finally:
        n1.kill()
        if n2 is not None:
            n2.stop()
