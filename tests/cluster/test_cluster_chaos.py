"""Three ``tiered serve`` nodes, object-store durability, faults: no acknowledged append is ever lost.

Three processes on loopback share one prefix (8 shards, lease TTL 1.5 s on an
idle machine, stretched by the load like every wait: ``tests/support/deadlines.py``; WAL
interval 100 ms). A checker appends unique chunks through random nodes while
it SIGKILLs a node, SIGSTOPs another past its TTL (with appends in flight to
it) and resumes it, and restarts the killed node under the same id and data
dir. Every append answered 204 is recorded with its end offset (offsets are
byte positions). At the end, healed, each stream is read through every node
and must hold every acknowledged chunk byte-exact at its offset, with no two
acknowledged chunks sharing a byte (no offset used twice). Unacknowledged
appends may or may not have landed (at least once), never on top of an
acknowledged one.

Runs on moto; on Ceph RGW too under CI=true (the gateway is slow to start).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from tests.support import ceph_rgw as rgw
from tests.support import s3_server
from tests.support.cluster_support import readiness, start_node, start_nodes, unique_prefix
from tests.support.deadlines import Deadline, scaled, wait_for
from tests.support.http_helpers import create, read, request, unique
from tests.support.server_process import ServerProcess
from tests.support.store_proxy import FaultPlan, StoreProxy
from tests.support.tcp_proxy import TcpProxy
from tiered.cli.verify import load_state_read_only
from tiered.cluster.membership import keys
from tiered.cluster.membership.cas import CasError, ObjectStoreCas
from tiered.cluster.membership.manifest import decode_entry
from tiered.cluster.membership.shards import shard_of
from tiered.cluster.shards.wal import restore
from tiered.cluster.shards.wal_index import wal_prefix
from tiered.cluster.shards.wal_lifecycle import check_pruned_chain
from tiered.cold.objects.store import ObjectStoreError
from tiered.core.config import Config
from tiered.core.errors import TieredError
from tiered.core.ids import DEFAULT_BUCKET
from tiered.engine.engine import open_store
from tiered.hot.segment import parse_segment_name

pytestmark = pytest.mark.timeout(240)

TTL = (
    1.5  # the lease TTL on an idle machine; a cluster gets it scaled by the load (cluster_support.lease_ttl)
)
SHARDS = 8
STREAMS = 12


@dataclass(frozen=True)
class Store:
    url: str
    bucket: str
    region: str
    env: dict[str, str]


@pytest.fixture(params=["moto", "ceph"])
def store(request: pytest.FixtureRequest) -> Store:
    if request.param == "ceph" and os.environ.get("CI") != "true":
        pytest.skip("the three-node run on Ceph RGW runs under CI=true")
    request.getfixturevalue("aws_test_env")
    if request.param == "moto":
        moto: s3_server.S3Endpoint = request.getfixturevalue("moto_s3")
        return Store(moto.url, moto.bucket, moto.region, dict(s3_server._TEST_ENV))
    gateway: rgw.RGWEndpoint = request.getfixturevalue("ceph_rgw")
    return Store(gateway.url, gateway.bucket, gateway.region, gateway.aws_env())


@dataclass
class Checker:
    nodes: dict[str, ServerProcess]
    streams: list[str]
    rng: random.Random = field(default_factory=lambda: random.Random(1313))
    acked: dict[str, list[tuple[int, bytes]]] = field(default_factory=dict)  # stream -> (end offset, chunk)
    attempts: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def append_via(self, node: str, stream: str, size: int = 0) -> int:
        """One append of a fresh chunk (random size below 64, or ``size``) through ``node``; its status (0: no answer)."""
        with self.lock:
            self.attempts += 1
            n = self.attempts
        body = os.urandom(size or self.rng.randrange(1, 64))
        chunk = f"<{stream}#{n}:".encode() + body + b">"
        srv = self.nodes[node]
        try:
            status, headers, _ = request(
                "POST",
                f"{srv.url}/v1/stream/{stream}",
                {"Content-Type": "application/octet-stream"},
                chunk,
                timeout=8,
            )
        except OSError:
            return 0
        if status == 204:
            end = int(headers["Stream-Next-Offset"].replace("_", ""))
            with self.lock:
                self.acked.setdefault(stream, []).append((end, chunk))
        return status

    def round(self, count: int, via: list[str]) -> list[int]:
        return [self.append_via(self.rng.choice(via), self.rng.choice(self.streams)) for _ in range(count)]

    def verify(self) -> int:
        """Every acknowledged chunk byte-exact at its offset through every node; no byte acknowledged twice."""
        checked = 0
        for stream in self.streams:
            acks = sorted(self.acked.get(stream, []))
            contents = []
            for srv in self.nodes.values():
                deadline = Deadline(10 * TTL)
                status, _, body = read(f"{srv.url}/v1/stream/{stream}", "-1")
                while status == 503 and not deadline.expired():  # its shard is being handed over
                    time.sleep(0.2)
                    status, _, body = read(f"{srv.url}/v1/stream/{stream}", "-1")
                assert status == 200, (stream, status, body)
                contents.append(body)
            assert all(c == contents[0] for c in contents), f"{stream}: the nodes disagree"
            data = contents[0]
            previous_end = 0
            for end, chunk in acks:
                start = end - len(chunk)
                assert start >= previous_end, f"{stream}: acknowledged chunks overlap at {start}"
                assert data[start:end] == chunk, f"{stream}: acknowledged chunk lost or changed at {start}"
                previous_end = end
                checked += 1
        return checked


def _settles(checker: Checker, timeout: float = 30 * TTL, via: list[str] | None = None) -> bool:
    """Bounded: until 10 appends in a row through random nodes are acknowledged (handoffs finished).

    A rejoin moves about a third of the shards, one handoff each (flush, release, fence, restore),
    and any append that meets one is a 503; on two loaded CPUs that took longer than 15 TTLs once.
    """
    deadline = Deadline(timeout)
    while not deadline.expired():
        if checker.round(10, via or ["n1", "n2", "n3"]) == [204] * 10:
            return True
        time.sleep(0.3)
    return False


def _wait_all_served(nodes: dict[str, ServerProcess], timeout: float) -> set[int]:
    """Bounded (``timeout`` on an idle machine, scaled): until ``nodes`` serve every shard between them."""
    deadline = Deadline(timeout)
    served: set[int] = set()
    while not deadline.expired():
        served = set()
        for srv in nodes.values():
            try:
                served |= set(readiness(srv.url)["checks"]["serving"])  # type: ignore[index]
            except OSError:
                pass
        if served == set(range(SHARDS)):
            return served
        time.sleep(0.2)
    return served


NODE_ARGS: dict[str, Any] = {
    "shards": SHARDS,
    "ttl_s": TTL,
    "durability": "object-store",
    "wal_interval_ms": 100,
}


@dataclass
class Cluster:
    nodes: dict[str, ServerProcess]
    store: Store
    prefix: str
    proxy: TcpProxy  # between n3 and the store

    def via(self) -> dict[str, Store]:
        """The store as each node reaches it where not directly: n3 through the proxy."""
        return {"n3": replace(self.store, url=self.proxy.url)}

    def start(self, base: Path, name: str) -> ServerProcess:
        """Start node ``name`` again (its data dir kept)."""
        store = self.via().get(name, self.store)
        self.nodes[name] = start_node(base, store, self.prefix, name, env=store.env, **NODE_ARGS)  # type: ignore[arg-type]
        return self.nodes[name]


@pytest.fixture
def cluster(store: Store, tmp_path: Path) -> Iterator[Cluster]:
    target = urllib.parse.urlsplit(store.url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 80).start()
    c = Cluster({}, store, unique_prefix("chaos"), proxy)
    try:
        with start_nodes(tmp_path, store, c.prefix, via=c.via(), env=store.env, **NODE_ARGS) as c.nodes:  # type: ignore[arg-type]
            try:
                yield c
            finally:  # before the nodes stop: they reach the store, and a paused one can stop
                proxy.set("forward")
                for srv in c.nodes.values():
                    if srv.proc is not None and srv.proc.poll() is None:
                        try:
                            os.killpg(srv.proc.pid, signal.SIGCONT)
                        except ProcessLookupError:
                            pass
    finally:
        proxy.stop()


def test_no_acknowledged_append_is_lost_through_kills_pauses_restarts_and_store_faults(
    cluster: Cluster, tmp_path: Path
) -> None:
    nodes = cluster.nodes
    assert _wait_all_served(nodes, 10 * TTL) == set(range(SHARDS))
    streams = [unique("chaos") for _ in range(STREAMS)]
    for i, stream in enumerate(streams):
        srv = list(nodes.values())[i % 3]
        statuses = [create(f"{srv.url}/v1/stream/{stream}")[0] for _ in range(1)]
        deadline = Deadline(10 * TTL)
        while statuses[-1] == 503 and not deadline.expired():  # a shard still moving after start-up
            time.sleep(0.2)
            statuses.append(create(f"{srv.url}/v1/stream/{stream}")[0])
        assert statuses[-1] in (200, 201), statuses
    checker = Checker(nodes, streams)

    # Calm: every append through any node is acknowledged (once placement settled after start-up).
    assert _settles(checker), "the new cluster did not acknowledge 10 appends in a row"
    checker.round(40, ["n1", "n2", "n3"])

    # SIGKILL n1: its shards are taken over after TTL + margin and restored from the store.
    nodes["n1"].kill()
    statuses = checker.round(30, ["n2", "n3"])
    deadline = Deadline(10 * TTL)
    while not deadline.expired() and checker.round(1, ["n2", "n3"]) != [204]:
        time.sleep(0.1)
    assert _wait_all_served({k: nodes[k] for k in ("n2", "n3")}, 10 * TTL) == set(range(SHARDS)), statuses
    assert _settles(checker, via=["n2", "n3"]), "n1's shards were not taken over"

    # SIGSTOP n2 past its TTL, with appends in flight to it; n3 takes its shards over. Resumed, n2 is
    # a zombie: its window closed on its own clock and its next chain write finds the new fence.
    proc2 = nodes["n2"].proc
    assert proc2 is not None
    os.killpg(proc2.pid, signal.SIGSTOP)
    in_flight = [threading.Thread(target=checker.round, args=(2, ["n2"])) for _ in range(3)]
    for t in in_flight:
        t.start()
    try:
        # Stopped until its shards are n3's (n2 declared dead past its TTL): every shard, n1 being dead.
        assert _wait_all_served({"n3": nodes["n3"]}, 10 * TTL) == set(range(SHARDS))
        deadline = Deadline(10 * TTL)
        while not deadline.expired() and checker.round(1, ["n3"]) != [204]:
            time.sleep(0.1)
        checker.round(20, ["n3"])
    finally:
        os.killpg(proc2.pid, signal.SIGCONT)
    for t in in_flight:
        t.join(timeout=30)
    checker.round(20, ["n2", "n3"])

    # Restart n1 under the same id and data dir; the cluster heals and rebalances.
    cluster.start(tmp_path, "n1")
    assert _wait_all_served(nodes, 10 * TTL) == set(range(SHARDS))
    assert _settles(checker), "the cluster did not acknowledge 10 appends in a row after n1 rejoined"
    checker.round(30, ["n1", "n2", "n3"])  # more acknowledged appends to verify (a late handoff may 503)
    assert readiness(nodes["n1"].url)["checks"]["incarnation"] == 2  # type: ignore[index]

    # n3 cut off from the store (connections refused): it cannot beat nor commit, so it acknowledges
    # nothing; its peers declare it dead and restore its shards. Healed, it rejoins.
    cluster.proxy.set("refuse")
    try:
        checker.round(10, ["n3"])
        # Cut off until its peers serve every shard between them (n3 declared dead past its TTL).
        assert _wait_all_served({k: nodes[k] for k in ("n1", "n2")}, 10 * TTL) == set(range(SHARDS))
        checker.round(20, ["n1", "n2", "n3"])
    finally:
        cluster.proxy.set("forward")
    # A slow store (every chunk to and from it delayed) for n3: slower, never wrong.
    cluster.proxy.set("delay", 0.05)
    try:
        checker.round(20, ["n1", "n2", "n3"])
    finally:
        cluster.proxy.set("forward")
    assert _wait_all_served(nodes, 10 * TTL) == set(range(SHARDS))
    assert _settles(checker), "the healed cluster did not acknowledge 10 appends in a row"

    checked = checker.verify()
    assert checked >= 120, checked


# -- every node behind one faulty store; the GC audited afterwards ----------------------------------

GRACE_S = 2.0
RECONCILE_S = 3.0
GC_ARGS = (
    "--gc-grace-s", str(GRACE_S), "--gc-interval-s", "1", "--reconcile-interval-s", str(RECONCILE_S),
    # Small segments dropped once cold: flushed segments are deleted, so their WAL objects become garbage.
    "--segment-bytes", str(1 << 20), "--max-body-bytes", str(1 << 19), "--hot-retention-s", "0",
)  # fmt: skip


@dataclass
class FaultyCluster:
    nodes: dict[str, ServerProcess]
    store: Store
    prefix: str
    proxy: StoreProxy  # between every node and the store

    def proxied(self) -> Store:
        """The store as every node reaches it: through the proxy."""
        return replace(self.store, url=self.proxy.url)

    def start(self, base: Path, name: str) -> ServerProcess:
        """Start node ``name`` again (its data dir kept)."""
        store = self.proxied()
        self.nodes[name] = start_node(
            base, store, self.prefix, name, env=store.env, **NODE_ARGS, extra=GC_ARGS  # type: ignore[arg-type]
        )  # fmt: skip
        return self.nodes[name]


@pytest.fixture
def faulty_cluster(store: Store, tmp_path: Path) -> Iterator[FaultyCluster]:
    target = urllib.parse.urlsplit(store.url)
    proxy = StoreProxy(target.hostname or "127.0.0.1", target.port or 80).start()
    c = FaultyCluster({}, store, unique_prefix("faults"), proxy)
    try:
        proxied = c.proxied()
        with start_nodes(
            tmp_path, proxied, c.prefix, env=proxied.env, **NODE_ARGS, extra=GC_ARGS  # type: ignore[arg-type]
        ) as c.nodes:  # fmt: skip
            try:
                yield c
            finally:  # before the nodes stop: they reach the store
                proxy.heal()
    finally:
        proxy.stop()


def _owner_of(nodes: dict[str, ServerProcess], stream: str) -> str | None:
    shard = shard_of(DEFAULT_BUCKET, stream, SHARDS)
    for name, srv in nodes.items():
        try:
            if shard in readiness(srv.url)["checks"]["serving"]:  # type: ignore[index,operator]
                return name
        except OSError:
            continue
    return None


@dataclass
class Producer:
    """Idempotent appends (Producer-Id/Epoch/Seq) through one node, each retried with its seq until acknowledged."""

    url: str
    stream: str
    acked: list[bytes] = field(default_factory=list)
    retries: int = 0
    gave_up: bytes | None = None
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self, count: int) -> None:
        for seq in range(count):
            chunk = f"<p{seq}:".encode() + os.urandom(16).hex().encode() + b">"
            deadline = Deadline(12 * TTL)
            while True:
                try:
                    status, _, _ = request(
                        "POST",
                        f"{self.url}/v1/stream/{self.stream}",
                        {
                            "Content-Type": "application/octet-stream",
                            "Producer-Id": "chaos",
                            "Producer-Epoch": "0",
                            "Producer-Seq": str(seq),
                        },
                        chunk,
                        timeout=8,
                    )
                except OSError:
                    status = 0
                if status in (200, 204):  # 204: a retry of one that had landed (deduplicated)
                    self.acked.append(chunk)
                    break
                assert status in (0, 503), status  # never a 409 (a gap) nor a 500
                if deadline.expired():
                    self.gave_up = chunk  # it may have landed; no later seq is sent (that would be a gap)
                    return
                self.retries += 1
                time.sleep(0.1)
            if self.stop.is_set():
                return


async def _garbage_older_than(config: Config, scratch: Path, horizon_wall: float) -> list[str]:
    """While the nodes run: what reconciliation should have released or deleted by now.

    Each shard is restored from the store as a new owner would (read-only): the cold objects under
    its ``data/`` that its journal does not know (not even as a copy in flight), and the WAL objects
    no commit references and no checkpoint released, last written before ``horizon_wall``.
    """
    store = await open_store(config, read_only=True, probe=False)
    found: list[str] = []
    try:
        listed = {info.key: info async for info in store.list("")}
        for shard in range(SHARDS):
            directory = scratch / f"{shard:04d}"
            index = await restore(store, ObjectStoreCas(store), shard, directory)
            state = load_state_read_only(Config(data_dir=str(directory)))
            base, live = f"shards/{shard:04d}/", index.referenced()
            for key, info in listed.items():
                if info.last_modified.timestamp() >= horizon_wall:
                    continue
                if key.startswith(base + "data/"):
                    name = key[len(base) :]
                    if name not in state.cold_objects and name not in state.copies_in_flight:
                        found.append(key)
                elif key.startswith(wal_prefix(shard)) and key not in live and key not in index.released:
                    found.append(key)
    finally:
        await store.close()
    return found


async def _audit(config: Config, scratch: Path, stopped_wall: float) -> dict[str, int]:
    """Read the store as a restore would: nothing referenced is missing, nothing unreferenced is left over.

    For every shard: the chain is valid (pruned prefix allowed); the index from
    the latest checkpoint on names only WAL objects that exist (``restore``
    reads them all); every other WAL object is released in that checkpoint
    (within its grace). The restored journal's cold objects with owners exist;
    every other cold object under the shard's ``data/`` is known to the journal
    (released, within grace) or was written within the reconciliation interval
    plus the grace before the nodes stopped (an orphan reconciliation had not
    yet seen).
    """
    store = await open_store(config, read_only=True, probe=False)
    figures = {"wal_live": 0, "wal_released": 0, "cold_live": 0, "pruned_shards": 0, "entries": 0}
    figures["segments_gone"] = 0
    recent_ms = int((stopped_wall - RECONCILE_S - GRACE_S - 10) * 1000)
    try:
        listed = {info.key: info async for info in store.list("")}
        for shard in range(SHARDS):
            mprefix = keys.manifest_prefix(shard)
            entries = []
            for key in sorted(k for k in listed if k.startswith(mprefix)):
                seq = keys.seq_of_manifest_key(key)
                assert seq is not None, key
                entries.append(decode_entry(await store.get(key), shard, seq))
            check_pruned_chain(entries)
            figures["entries"] += len(entries)
            if entries and len(entries) < entries[-1].seq:
                figures["pruned_shards"] += 1
            directory = scratch / f"{shard:04d}"
            index = await restore(store, ObjectStoreCas(store), shard, directory)
            live = index.referenced()
            assert live <= listed.keys(), f"shard {shard}: GC deleted WAL objects the chain references"
            for key in (k for k in listed if k.startswith(wal_prefix(shard))):
                age = stopped_wall - listed[key].last_modified.timestamp()
                assert key in live or key in index.released, (
                    f"shard {shard}: WAL object {key} leaked (written {age:.1f} s before the stop)"
                )
                # Released and still there: only if released lately (the grace, then the next GC pass).
                assert key in live or index.released[key] >= recent_ms, f"shard {shard}: {key} not deleted"
            segments = [
                parse_segment_name(n.removeprefix("hot/")) for n in index.files if n.startswith("hot/")
            ]
            if segments and min(s for s in segments if s is not None) > 1:
                figures["segments_gone"] += 1  # flushed to cold objects and deleted: its WAL objects released
            figures["wal_live"] += len(live)
            figures["wal_released"] += len(index.released)
            state = load_state_read_only(Config(data_dir=str(directory)))
            base = f"shards/{shard:04d}/"
            for key, obj in state.cold_objects.items():
                if obj.refs > 0:
                    assert base + key in listed, f"shard {shard}: GC deleted cold object {key} still owned"
                    figures["cold_live"] += 1
            young = stopped_wall - (RECONCILE_S + GRACE_S + 10)
            for key, info in listed.items():
                if key.startswith(base + "data/") and key[len(base) :] not in state.cold_objects:
                    age = stopped_wall - info.last_modified.timestamp()
                    assert info.last_modified.timestamp() >= young, (
                        f"shard {shard}: cold object {key} leaked (written {age:.1f} s before the stop)"
                    )
    finally:
        await store.close()
    return figures


def test_store_faults_under_every_node_lose_nothing_and_the_gc_leaks_nothing(
    faulty_cluster: FaultyCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Drops, delays and black holes between every node and the store; a kill under forwarded producer appends."""
    cluster, nodes = faulty_cluster, faulty_cluster.nodes
    assert _wait_all_served(nodes, 10 * TTL) == set(range(SHARDS))
    streams = [unique("faults") for _ in range(8)]
    for i, stream in enumerate(streams):
        srv = list(nodes.values())[i % 3]
        deadline = Deadline(10 * TTL)
        status = create(f"{srv.url}/v1/stream/{stream}")[0]
        while status == 503 and not deadline.expired():
            time.sleep(0.2)
            status = create(f"{srv.url}/v1/stream/{stream}")[0]
        assert status in (200, 201), status
    checker = Checker(nodes, streams)
    assert _settles(checker), "the new cluster did not acknowledge 10 appends in a row"
    # Enough bytes to roll a segment in each stream's shard: flushed to cold objects, then deleted.
    for stream in streams:
        for _ in range(3):
            checker.append_via(checker.rng.choice(list(nodes)), stream, size=400_000)

    # The store misbehaves for every node at once, for a bounded period: appends go on throughout.
    cluster.proxy.set_plan(FaultPlan(drop=0.02, delay=0.1, blackhole=0.004, blackhole_s=2.0))
    try:
        deadline = time.monotonic() + 12.0
        while time.monotonic() < deadline:
            checker.round(5, ["n1", "n2", "n3"])
    finally:
        cluster.proxy.heal()
    applied = dict(cluster.proxy.applied)
    assert applied.get("drop-request", 0) + applied.get("drop-answer", 0) > 0, applied
    assert applied.get("delay", 0) > 0 and applied.get("blackhole", 0) > 0, applied
    assert _wait_all_served(nodes, 10 * TTL) == set(range(SHARDS))
    assert _settles(checker), "the healed cluster did not acknowledge 10 appends in a row"

    # A producer appends through a node that does not own its stream's shard; the owner is SIGKILLed
    # meanwhile. The forwarder resends producer appends to the new owner; acknowledged ones land once.
    stream = streams[0]
    owner = _owner_of(nodes, stream)
    assert owner is not None
    via = next(n for n in nodes if n != owner)
    producer = Producer(nodes[via].url, stream)
    thread = threading.Thread(target=producer.run, args=(60,))
    thread.start()
    wait_for(lambda: producer.acked or not thread.is_alive(), 10 * TTL, "a producer append through the owner")
    nodes[owner].kill()
    before = len(producer.acked)
    # Its shard taken over (the owner's TTL, then a restore), the resent appends land at the new owner.
    wait_for(lambda: len(producer.acked) > before or not thread.is_alive(), 20 * TTL, "the new owner")
    producer.stop.set()
    thread.join(timeout=60)
    assert not thread.is_alive()
    # Acknowledged before the kill (through the old owner) and after it (through the new one).
    assert before >= 1 and len(producer.acked) > before, (before, len(producer.acked), producer.gave_up)
    cluster.start(tmp_path, owner)  # back under the same id: the cluster heals and rebalances
    assert _wait_all_served(nodes, 10 * TTL) == set(range(SHARDS))
    assert _settles(checker)

    checked = checker.verify()
    assert checked >= 60, checked
    _, _, body = read(f"{nodes[via].url}/v1/stream/{stream}", "-1")
    for chunk in producer.acked:
        assert body.count(chunk) == 1, f"acknowledged producer append {chunk!r} is not there exactly once"
    if producer.gave_up is not None:
        assert body.count(producer.gave_up) <= 1

    for k, v in cluster.store.env.items():
        monkeypatch.setenv(k, v)
    config = Config(
        data_dir=str(tmp_path / "audit"),
        cold_store="s3",
        s3_bucket=cluster.store.bucket,
        s3_prefix=cluster.prefix,
        s3_endpoint=cluster.store.url,
        s3_region=cluster.store.region,
        s3_addressing_style="path",
    )
    # Healed and quiet: reconciliation (every RECONCILE_S) releases what nothing references, and the
    # released is deleted after GRACE_S: wait until nothing older than that is left (on a loaded
    # machine the passes come later than their interval, so no fixed time is enough).
    garbage: list[str] = []

    def reconciled() -> bool:
        nonlocal garbage
        horizon = time.time() - (RECONCILE_S + GRACE_S + 2)
        try:
            garbage = asyncio.run(_garbage_older_than(config, tmp_path / "live", horizon))
        except (ObjectStoreError, CasError, TieredError) as exc:  # pruned while restoring: again
            garbage = [f"(restore failed: {exc!r})"]
        return not garbage

    wait_for(reconciled, 30, "reconciliation", interval=1, explain=lambda: f"left over: {garbage[:5]}")
    # Then a clean stop (handoff: snapshot, ship, checkpoint). No GC runs while the nodes stop, so the
    # audit counts ages from the moment they were asked to, however long the stop takes.
    stopped = time.time()
    for srv in nodes.values():  # all at once: nobody takes a shard over from a stopping peer
        if srv.proc is not None:
            srv.proc.send_signal(signal.SIGTERM)
    for srv in nodes.values():
        assert srv.proc is not None and srv.proc.wait(scaled(30)) == 0  # a clean stop: every shard handed off
    figures = asyncio.run(_audit(config, tmp_path / "audit", stopped))
    print("store faults applied:", applied, "audit:", figures)
    assert figures["wal_live"] > 0 and figures["cold_live"] > 0, figures
    assert figures["pruned_shards"] > 0 and figures["segments_gone"] > 0, figures
