"""Cluster-mode ``tiered serve`` processes for black-box tests (one object-store prefix, several nodes).

``start_nodes`` starts a cluster (and stops it), ``start_node`` one node of it (or
again, after a kill); ``cluster_module_server`` is a single-node cluster for a
module; ``wait_served`` and ``wait_placed`` wait for the shards to settle.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support import s3_server
from tests.support.deadlines import Deadline, load_factor, wait_for
from tests.support.s3_server import S3Endpoint
from tests.support.server_process import ServerProcess
from tiered.cluster.membership.placement import assignment

# The load factor each cluster (one object-store prefix) got when its first node started.
_LEASE_SCALE: dict[str, float] = {}


def lease_ttl(prefix: str, ttl_s: float) -> float:
    """``ttl_s`` (the lease TTL a test chose for an idle machine) stretched by the load, the same for
    every node of the cluster on ``prefix`` (whenever it starts: nodes must agree on the TTL).

    A heartbeat later than the TTL gets a live node declared dead. On a loaded machine a starved node,
    or the store answering slowly, misses a short TTL: the cluster churns (shards move, requests meet
    503s) where the test meant a stable one. Tests' waits stretch by the same factor (deadlines.py).
    """
    return round(ttl_s * _LEASE_SCALE.setdefault(prefix, load_factor()), 2)


def cluster_args(
    s3: S3Endpoint,
    prefix: str,
    node_id: str,
    *,
    shards: int = 8,
    ttl_s: float = 1.5,
    durability: str = "local",
    wal_interval_ms: int = 100,
    extra: tuple[str, ...] = (),
) -> list[str]:
    return [
        "--cold-store", "s3",
        "--s3-bucket", s3.bucket,
        "--s3-prefix", prefix,
        "--s3-endpoint", s3.url,
        "--s3-region", s3.region,
        "--s3-addressing-style", "path",
        "--cluster-node-id", node_id,
        "--cluster-shards", str(shards),
        "--cluster-lease-ttl-s", str(lease_ttl(prefix, ttl_s)),
        "--durability", durability,
        "--cluster-wal-interval-ms", str(wal_interval_ms),
        "--long-poll-timeout-s", "2",
        *extra,
    ]  # fmt: skip


def unique_prefix(name: str) -> str:
    return f"cluster-{name}-{uuid.uuid4().hex[:8]}"


def cluster_env() -> dict[str, str]:
    return dict(s3_server._TEST_ENV)


def start_node(
    base: Path,
    s3: S3Endpoint,
    prefix: str,
    node_id: str,
    port: int | None = None,
    env: dict[str, str] | None = None,
    **kw: object,
) -> ServerProcess:
    """Start (or restart, same data dir) node ``node_id``; ``env``: the store's credentials (moto's by default)."""
    srv = ServerProcess(
        base / node_id,
        *cluster_args(s3, prefix, node_id, **kw),  # type: ignore[arg-type]
        env=env if env is not None else cluster_env(),
    )
    if port is not None:
        srv.port = port
    return srv.start(timeout=40)


def readiness(url: str) -> dict[str, object]:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=5) as resp:
            return dict(json.loads(resp.read()))
    except urllib.error.HTTPError as exc:
        return dict(json.loads(exc.read()))


@contextmanager
def start_nodes(
    base: Path,
    s3: S3Endpoint,
    prefix: str,
    names: Sequence[str] = ("n1", "n2", "n3"),
    *,
    via: Mapping[str, S3Endpoint] | None = None,
    env: dict[str, str] | None = None,
    **kw: object,
) -> Iterator[dict[str, ServerProcess]]:
    """The nodes ``names`` of the cluster on ``prefix``, started in order with the same options
    (``start_node``'s), by name; every one is stopped on leaving, also when one fails to start.

    ``via[name]``: the store as that node reaches it (through a proxy), else ``s3``. The dict is
    the caller's: a node restarted in its place (``start_node``) is the one stopped.
    """
    nodes: dict[str, ServerProcess] = {}
    try:
        for name in names:
            store = via.get(name, s3) if via is not None else s3
            nodes[name] = start_node(base, store, prefix, name, env=env, **kw)
        yield nodes
    finally:
        for node in nodes.values():
            node.stop()


def cluster_module_server(
    s3: S3Endpoint, tmp_path_factory: Any, name: str, *args: str, shards: int = 4, durability: str = "local"
) -> Iterator[ServerProcess]:
    """Body of a module-scoped fixture: a single-node cluster serving every shard (its own prefix)."""
    base = tmp_path_factory.mktemp(f"cluster-{name}")
    with start_nodes(
        base,
        s3,
        unique_prefix(name),
        ("n1",),
        shards=shards,
        ttl_s=4.0,
        durability=durability,
        wal_interval_ms=5,
        extra=args,
    ) as nodes:
        yield nodes["n1"]


def serving(srv: ServerProcess) -> set[int]:
    try:
        return set(readiness(srv.url)["checks"]["serving"])  # type: ignore[index,call-overload]
    except OSError:
        return set()


def reaches_every_shard(srv: ServerProcess, headers: dict[str, str] | None = None) -> bool:
    """Whether ``srv`` answers ``GET /v1/buckets``, which every shard answers a part of, with a 200."""
    req = urllib.request.Request(srv.url + "/v1/buckets", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return bool(resp.status == 200)
    except (urllib.error.HTTPError, OSError):
        return False


def wait_every_shard_reachable(
    nodes: list[ServerProcess], headers: dict[str, str] | None = None, seconds: float = 20.0
) -> None:
    """Wait until every node reaches every shard. ``wait_served`` sees each node serve its own shards;
    the others learn it from the leases a moment later, and until then a request that needs a shard of
    another node is refused with 503 (no serving owner), which a test must not take for its subject."""
    for srv in nodes:
        wait_for(
            lambda srv=srv: reaches_every_shard(srv, headers), seconds, f"{srv.url} to reach every shard"
        )


def wait_served(
    nodes: list[ServerProcess], shards: int, timeout: float, *, every_node: bool = False
) -> list[set[int]]:
    """Wait (bounded: ``timeout`` on an idle machine, scaled by the load) until every shard is served by
    one of ``nodes`` (and, optionally, each node serves some)."""
    deadline = Deadline(timeout)
    sets: list[set[int]] = []
    while not deadline.expired():
        sets = [serving(n) for n in nodes]
        if set().union(*sets) == set(range(shards)) and (not every_node or all(sets)):
            break
        time.sleep(0.1)
    return sets


def wait_placed(
    nodes: Mapping[str, ServerProcess], shards: int, timeout: float, headers: dict[str, str] | None = None
) -> None:
    """Wait (bounded: ``timeout`` on an idle machine, scaled by the load) until each of ``nodes``
    serves exactly the shards placement gives it among them (rendezvous over their names).

    Until then a request meeting a handoff is refused with 503 (by design; clients retry),
    which the tests that wait for this are not about. ``headers``: the credential a
    ``GET /v1/buckets`` needs (auth on).
    """
    want = [{s for s, owner in enumerate(assignment(shards, list(nodes))) if owner == name} for name in nodes]
    servers = list(nodes.values())
    deadline = Deadline(timeout)
    while not deadline.expired() and wait_served(servers, shards, 5, every_node=True) != want:
        time.sleep(0.2)
    assert wait_served(servers, shards, 1) == want
    wait_every_shard_reachable(servers, headers)  # and each knows where the others' shards are
