"""The cluster protocol against real S3 servers: moto, and Ceph RGW (which compares If-Match unquoted).

``ObjectStoreCas`` over ``S3Store`` must give the protocol exactly the
conditional-write semantics the in-memory store models; then two
``ClusterNode`` shells on real clocks with a short TTL contend for the shards
of one bucket prefix, one is frozen (its loop stops being called) past its
TTL and resumed, and it must fence itself: refuse to acknowledge on its own
clock, find its chain position taken by the new owner's fence, learn it was
declared dead, and rejoin as a new incarnation.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest

from tests.support import ceph_rgw as rgw
from tests.support import s3_server
from tests.support.deadlines import load_factor, scaled
from tiered.cluster.membership import keys
from tiered.cluster.membership.cas import AlreadyExists, Listed, ObjectStoreCas, PreconditionFailed
from tiered.cluster.membership.lease import LeaseTiming, decode_lease
from tiered.cluster.membership.manifest import ManifestEntry, check_chain, decode_entry
from tiered.cluster.membership.node_shell import ClusterNode, NodeConfig
from tiered.cluster.membership.placement import assignment
from tiered.cold.objects.retry import RetryPolicy
from tiered.cold.objects.s3 import S3Store
from tiered.core.clock import SystemClock
from tiered.core.errors import ErrorCode, TieredError

pytestmark = pytest.mark.timeout(300)

# Lease timing for an idle machine, stretched by the load when the module is collected (tests/support/deadlines.py):
# a shell starved past a short TTL is declared dead, which this test does on purpose, and only then.
_SCALE = load_factor()
TIMING = LeaseTiming(ttl_s=1.5 * _SCALE, margin_s=0.3 * _SCALE)
BEAT_S = 0.3 * _SCALE
SHARDS = 4
NODES = ("x", "y")  # two alive: two shards each


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    bucket: str
    region: str

    def store(self) -> S3Store:
        return S3Store(
            self.bucket,
            f"cluster-{uuid.uuid4().hex}",
            endpoint_url=self.url,
            region=self.region,
            addressing_style="path",
            retry=RetryPolicy(attempts=3, base=0.01, cap=0.05),
            connect_timeout=2,
            read_timeout=5,
        )

    def run(self, scenario: Callable[[S3Store], Awaitable[None]]) -> None:
        async def main() -> None:
            async with self.store() as store:
                try:
                    await scenario(store)
                finally:
                    leftovers = [info.key async for info in store.list()]
                    assert await store.delete_many(leftovers) == []

        asyncio.run(main())


@pytest.fixture(params=["moto", "ceph"])
def target(request: pytest.FixtureRequest) -> Target:
    request.getfixturevalue("aws_test_env")
    if request.param == "moto":
        moto: s3_server.S3Endpoint = request.getfixturevalue("moto_s3")
        return Target("moto", moto.url, moto.bucket, moto.region)
    gateway: rgw.RGWEndpoint = request.getfixturevalue("ceph_rgw_env")
    return Target("ceph", gateway.url, gateway.bucket, gateway.region)


def test_the_adapter_gives_the_protocol_its_conditional_writes(target: Target) -> None:
    async def scenario(s3: S3Store) -> None:
        cas = ObjectStoreCas(s3)
        assert await cas.get("c/a") is None
        first = await cas.put_if_absent("c/a", b"one")
        with pytest.raises(AlreadyExists):
            await cas.put_if_absent("c/a", b"two")
        found = await cas.get("c/a")
        assert found is not None and (found.data, found.etag) == (b"one", first)
        with pytest.raises(PreconditionFailed):
            await cas.put_if_match("c/a", b"two", "0" * 32)
        with pytest.raises(PreconditionFailed):  # Ceph answers 412, AWS and moto 404: the same to us
            await cas.put_if_match("c/missing", b"two", first)
        second = await cas.put_if_match("c/a", b"two", first)  # Ceph: matched only unquoted
        with pytest.raises(PreconditionFailed):
            await cas.put_if_match("c/a", b"three", first)  # stale
        found = await cas.get("c/a")
        assert found is not None and (found.data, found.etag) == (b"two", second)
        await cas.put_if_absent("c/b", b"b")
        assert [item.key for item in await cas.list("c/")] == ["c/a", "c/b"]
        assert (await cas.list("c/"))[0] == Listed("c/a", second)
        await cas.delete("c/a")
        assert await cas.get("c/a") is None

    target.run(scenario)


async def _until(
    what: str, check: Callable[[], bool], step: Callable[[], Awaitable[None]], limit_s: float
) -> None:
    deadline = time.monotonic() + scaled(limit_s)
    while not check():
        assert time.monotonic() < deadline, f"not within {limit_s} s: {what}"
        await step()
        await asyncio.sleep(0.05)


async def _chain(cas: ObjectStoreCas, shard: int) -> list[ManifestEntry]:
    entries = []
    for item in await cas.list(keys.manifest_prefix(shard)):
        seq = keys.seq_of_manifest_key(item.key)
        found = await cas.get(item.key)
        assert seq is not None and found is not None
        entries.append(decode_entry(found.data, shard, seq))
    return entries


def test_two_shells_contend_and_a_frozen_one_fences_itself(target: Target) -> None:
    async def scenario(s3: S3Store) -> None:
        cas = ObjectStoreCas(s3)
        clock = SystemClock()

        def node(name: str) -> ClusterNode:
            config = NodeConfig(
                name, f"http://{name}.test", TIMING, shard_count=SHARDS, beat_interval_s=BEAT_S
            )
            return ClusterNode(cas, config, clock)

        x, y = node("x"), node("y")
        want = assignment(SHARDS, NODES)
        mine = {name: sorted(s for s in range(SHARDS) if want[s] == name) for name in NODES}
        assert mine["x"] and mine["y"]

        async def both() -> None:
            await x.tick()
            await y.tick()

        await _until(
            "both nodes serve their placement",
            lambda: sorted(x.serving()) == mine["x"] and sorted(y.serving()) == mine["y"],
            both,
            30,
        )
        shard = mine["x"][0]
        # One acknowledged write before the freeze. A machine starved past the lease margin makes x
        # refuse it (SHARD_NOT_OWNED: "could not renew its lease in time", as it must); the next
        # pass renews the lease, and the write is tried again. What follows is about the freeze.
        done: list[tuple[int, ManifestEntry]] = []

        async def commit_once() -> None:
            try:
                epoch = x.may_acknowledge(shard)
                done.append((epoch, await x.commit(shard, b"acknowledged before the freeze")))
            except TieredError as err:
                assert err.code is ErrorCode.SHARD_NOT_OWNED, err
                await both()

        await _until("x acknowledges one write", lambda: bool(done), commit_once, 30)
        epoch, committed = done[0]

        # Freeze x: its loop is no longer called. y may take x's shards only once x's window
        # has closed (one process, one clock: comparable here, never in the protocol).
        async def y_alone() -> None:
            await y.tick()
            if set(y.serving()) & set(mine["x"]):
                assert not x.window.allows(clock.monotonic()), (
                    "y serves x's shard while x may still acknowledge"
                )

        await _until(
            "y takes over every shard", lambda: sorted(y.serving()) == list(range(SHARDS)), y_alone, 30
        )
        assert y.may_acknowledge(shard) == epoch + 1

        # Resumed: x's own clock already refuses; a zombie past its gate finds its position fenced.
        with pytest.raises(TieredError) as err:
            x.may_acknowledge(shard)
        assert err.value.code is ErrorCode.SHARD_NOT_OWNED
        x.window.extend(clock.monotonic(), TIMING)  # as if it had checked just before freezing
        with pytest.raises(TieredError) as err:
            await x.commit(shard, b"zombie write")
        assert err.value.code is ErrorCode.SHARD_FENCED and err.value.context["epoch"] == epoch + 1
        assert shard not in x.holds

        # Its next pass learns it was declared dead; it rejoins and gets its placement back.
        await x.tick()
        assert x.me is None or x.incarnation == 2
        await _until(
            "x rejoins and both serve their placement again",
            lambda: (
                x.incarnation == 2 and sorted(x.serving()) == mine["x"] and sorted(y.serving()) == mine["y"]
            ),
            both,
            30,
        )
        assert x.may_acknowledge(shard) == epoch + 2

        for s in range(SHARDS):
            entries = await _chain(cas, s)
            check_chain(entries)
            assert b"zombie write" not in [e.payload for e in entries]
            lease = await cas.get(keys.lease_key(s))
            assert lease is not None
            assert decode_lease(lease.data, s).owner == want[s]
        assert committed in await _chain(cas, shard)
        await x.stop()
        await y.stop()

    target.run(scenario)
