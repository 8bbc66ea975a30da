"""A cluster node's wiring, in process: each shard's engine gets its hooks from the cluster's composition
(and its parts stay frozen), and the node's loops run under its supervisor (a crashing one is restarted
with backoff and shows in ``/readyz`` and ``/metrics``).

No peers and no S3: the composition runs over a stand-in view of the cluster
(two shards, both served here) and a local-directory store; the node's lease
loop runs against a store that fails the way a bug would (not a store error it
handles: an exception it does not expect).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.engine.test_engine_hooks import job_samples
from tests.engine.test_supervisor import Sleeps
from tests.support.frozen import outside_assignments, part_classes
from tests.support.gc_support import VirtualClock, make_config
from tiered.api.kit.types import Request, Response
from tiered.cluster.compose import ClusterFeatures, build_cluster_handler
from tiered.cluster.features.directory import ShardDirectory
from tiered.cluster.features.sub_feed import FeedObserver, FeedTable
from tiered.cluster.features.xfork import CrossShardForks
from tiered.cluster.gateway.forward import Forwarder
from tiered.cluster.gateway.routing import SUBSCRIPTIONS_KEY
from tiered.cluster.gc.pin_sweep import PinSweep
from tiered.cluster.membership import keys
from tiered.cluster.membership.cas import MemoryCasStore
from tiered.cluster.membership.node_shell import ClusterNode
from tiered.cluster.membership.secret import NodeSigner
from tiered.cluster.membership.shards import shard_of
from tiered.cluster.server import ClusterServer
from tiered.cluster.shards.host import shard_config
from tiered.cold.objects.localdir import LocalDirStore
from tiered.cold.objects.store import ObjectInfo
from tiered.core.clock import Clock
from tiered.core.config import Config
from tiered.core.ids import DEFAULT_BUCKET
from tiered.engine.engine import Engine
from tiered.engine.streams.model import AppendRequest, CreateRequest
from tiered.engine.supervisor import Backoff, Supervisor

pytestmark = pytest.mark.timeout(60)

SHARDS = 2
SECRET = b"s" * 32


@pytest.fixture(autouse=True)
def _admin_open(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIERED_ADMIN_TOKEN", raising=False)  # loopback, auth off: admin routes open


class View:
    """A node serving every shard (what ``ClusterFeatures`` reads of ``ClusterServer``)."""

    def __init__(self, config: Config, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        self.node_id = "n1"
        self.started = True
        self.node: ClusterNode | None = None
        self.forwarder = Forwarder("n1")
        self.supervisor = Supervisor(clock)
        self.served: dict[int, Engine] = {}
        self.acknowledged: list[int] = []

    def shard_of(self, bucket: str, name: str) -> int:
        return shard_of(bucket, name, SHARDS)

    def shard_count(self) -> int:
        return SHARDS

    def local_engine(self, shard: int) -> Engine | None:
        return self.served.get(shard)

    def owner_url(self, shard: int) -> tuple[str, str] | None:
        return None

    def check_acknowledge(self, shard: int) -> None:
        self.acknowledged.append(shard)

    async def durable(self, shard: int) -> None:
        raise AssertionError("local durability")

    def engines(self) -> dict[int, Engine]:
        return dict(self.served)

    def served_engines(self) -> dict[int, Engine]:
        return dict(self.served)

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        return True, {}

    def authenticate(self, header: str | None) -> None:
        pass


def _name_in(shard: int, stem: str) -> str:
    return next(
        n for n in (f"{stem}-{i}" for i in range(1000)) if shard_of(DEFAULT_BUCKET, n, SHARDS) == shard
    )


async def until(condition: Callable[[], bool], timeout_s: float = 15) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.02)


def test_each_shard_engine_gets_its_hooks_from_the_composition_and_its_parts_stay_frozen(
    tmp_path: Path,
) -> None:
    """Both shards' engines, built by the composition; a write in one reaches the subscriptions' shard's
    feed table through routing (the feed's sender is one of its engine's jobs), with no attribute set on a
    part from outside."""

    async def scenario() -> None:
        clock = VirtualClock()
        base = make_config(tmp_path / "node")
        view = View(base, clock)
        store = LocalDirStore(tmp_path / "objects")
        features = ClusterFeatures(
            view,
            store=store,
            cas=MemoryCasStore(),
            signer=NodeSigner(SECRET, clock),
            forwarder=view.forwarder,
        )
        target = shard_of(*SUBSCRIPTIONS_KEY, SHARDS)
        other = 1 - target
        probe = Engine(make_config(tmp_path / "probe"), clock)
        await probe.start(jobs=False)
        classes = part_classes(probe)
        await probe.stop()

        def engine(shard: int) -> Engine:
            config = shard_config(base, shard)
            config.data_path.mkdir(parents=True, exist_ok=True)
            return features.engine(shard, config, clock, None)

        with outside_assignments(classes) as seen:
            engines = {shard: engine(shard) for shard in (target, other)}
            for shard, e in engines.items():
                await e.start()
                view.served[shard] = e
            try:
                receiver, sender = engines[target], engines[other]
                table = receiver.subscriptions.remote_streams
                assert isinstance(table, FeedTable) and sender.subscriptions.remote_streams is None
                assert receiver.deliveries.remote_append == features.feeds.remote_append
                assert sender.deliveries.remote_append is None
                assert any(isinstance(o, FeedObserver) for o in sender.committer.observers)
                assert "subscription-feed" in sender.supervisor.names
                assert "subscription-feed" not in receiver.supervisor.names
                for shard, e in engines.items():
                    assert (
                        isinstance(e.streams.remote_forks, CrossShardForks)
                        and e.streams.remote_forks.shard == shard
                    )
                    assert isinstance(e.groups.directory, ShardDirectory)
                    assert e.gate.others is not None
                    assert [t.name for t in e.gc.tasks if isinstance(t, PinSweep)] == ["fork_pins"]
                # A stream of the default bucket in the other shard: reported to the subscriptions' shard.
                path = _name_in(other, "reported")
                create = CreateRequest("text/plain", None, None, None, False, b"hello")
                await sender.streams.create(DEFAULT_BUCKET, path, create)
                await sender.streams.append(DEFAULT_BUCKET, path, AppendRequest("text/plain", b"!", False))
                await until(lambda: table.tail(path) == 6)
            finally:
                for e in engines.values():
                    await e.stop()
                await view.forwarder.close()
                await store.close()
        assert seen == []

    asyncio.run(scenario())


class BuggyStore(LocalDirStore):
    """Fails the cluster's spec read with an exception nothing expects (a bug)."""

    async def head(self, key: str) -> ObjectInfo | None:
        if key == keys.CLUSTER:
            raise RuntimeError("injected: a bug in the lease loop")
        return await super().head(key)


def _cluster_config(tmp_path: Path) -> Config:
    config = Config(
        data_dir=str(tmp_path / "node"),
        cold_store="s3",
        s3_bucket="not-used",  # the store is handed in: nothing is opened from this config
        cluster_node_id="n1",
        cluster_shards=SHARDS,
        cluster_usage_interval_s=0.05,
    )
    config.validate()
    return config


async def _get(handler: Callable[[Request], Awaitable[Response]], path: str) -> tuple[int, bytes]:
    async def body() -> bytes:
        return b""

    response = await handler(Request("GET", path, "", {}, body))
    assert isinstance(response.body, bytes)
    return response.status, response.body


def test_a_crashing_cluster_loop_is_restarted_with_backoff_and_shows_in_readyz_and_metrics(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        clock = VirtualClock()
        sleeps = Sleeps(hold_at=3)
        supervisor = Supervisor(clock, backoff=Backoff(base_s=1, cap_s=60), sleep=sleeps)
        store = BuggyStore(tmp_path / "objects")
        cluster = ClusterServer(
            _cluster_config(tmp_path), clock, store, NodeSigner(SECRET, clock), supervisor=supervisor
        )
        handler = build_cluster_handler(cluster)
        try:
            await cluster.join("http://127.0.0.1:9")
            await asyncio.wait_for(sleeps.held.wait(), 15)
            assert sleeps.pauses == [1, 2, 4]
            await until(lambda: cluster.features.usage.rounds > 0)  # the other loop runs on
            status, raw = await _get(handler, "/readyz")
            checks = json.loads(raw)["checks"]
            assert status == 503
            assert checks["jobs_failing"] == [
                "cluster-membership: crash-looping (3 crashes in a row; "
                "last: RuntimeError('injected: a bug in the lease loop'))"
            ]
            assert checks["jobs"]["cluster-membership"]["restarts"] == 3
            assert checks["jobs"]["usage-exchange"] == {"state": "running", "restarts": 0}
            status, raw = await _get(handler, "/metrics")
            samples = job_samples(raw)
            assert status == 200
            assert samples["tiered_job_restarts_total", "cluster-membership"] == 3
            assert (
                samples["tiered_job_last_crash_timestamp_seconds", "cluster-membership"]
                == clock.now_ms() / 1000
            )
            assert samples["tiered_job_up", "cluster-membership"] == 0
            assert samples["tiered_job_up", "usage-exchange"] == 1
            # Let go, it is restarted again, and again later (the cap is far): the node keeps trying.
            sleeps.hold_at = 4
            sleeps.held.clear()
            sleeps.release_one()
            await asyncio.wait_for(sleeps.held.wait(), 15)
            assert (
                sleeps.pauses == [1, 2, 4, 8]
                and cluster.supervisor.status["cluster-membership"].restarts == 4
            )
        finally:
            await cluster.stop()

    asyncio.run(scenario())
