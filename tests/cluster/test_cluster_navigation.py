"""Navigation across two nodes (issue 22): listings merged over every shard, ordinals through a handoff.

Two ``tiered serve`` nodes (``l1``, ``l2``), 4 shards split between them, token auth: a listing
asked of either node scatters to every shard (two of them on the other node, forwarded with the
caller's credential) and merges the pages by one path cursor. Last, ``l2`` stops and hands its
shards to ``l1``, which serves the same record ordinals from the shards' WAL chain (object-store
durability).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.cluster_support import cluster_env, start_nodes, unique_prefix, wait_placed
from tests.support.deadlines import Deadline
from tests.support.http_helpers import request, unique
from tests.support.s3_server import S3Endpoint
from tests.support.server_process import ServerProcess
from tiered.cluster.membership.placement import assignment
from tiered.cluster.membership.shards import shard_of

pytestmark = pytest.mark.timeout(180)

SHARDS = 4
ADMIN = "listing-cluster-admin-0123456789"
OPERATOR = {"Authorization": f"Bearer {ADMIN}"}


@pytest.fixture(scope="module")
def nodes(
    moto_s3: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, ServerProcess]]:
    env = {**cluster_env(), "TIERED_ADMIN_TOKEN": ADMIN}
    base = tmp_path_factory.mktemp("cluster-listing")
    with start_nodes(
        base, moto_s3, unique_prefix("listing"), ("l1", "l2"), env=env, shards=SHARDS, ttl_s=2.0, durability="object-store", extra=("--auth", "tokens")
    ) as started:  # fmt: skip
        wait_placed(started, SHARDS, 40, OPERATOR)
        yield started


def call(
    srv: ServerProcess, method: str, path: str, headers: dict[str, str], body: Any = None
) -> tuple[int, Any]:
    """Retried on 503 as a client does (bounded): a node may briefly know no serving owner of a shard."""
    data = json.dumps(body).encode() if body is not None else None
    sent = {**headers, **({"Content-Type": "application/json"} if data else {})}
    deadline = Deadline(30)
    while True:
        status, _, out = request(method, srv.url + path, sent, data, timeout=20)
        if status != 503 or deadline.expired():
            return status, json.loads(out) if out else None


def pages(
    srv: ServerProcess, bucket: str, headers: dict[str, str], limit: int, prefix: str = ""
) -> list[str]:
    paths: list[str] = []
    after = ""
    for _ in range(1000):
        status, page = call(
            srv, "GET", f"/v1/buckets/{bucket}/streams?limit={limit}&prefix={prefix}&after={after}", headers
        )
        assert status == 200, page
        paths += [row["path"] for row in page["streams"]]
        if not page["has_more"]:
            return paths
        after = page["next_after"]
    raise AssertionError("the listing never ended")


def test_a_listing_through_either_node_has_every_shards_streams_once(nodes: dict[str, ServerProcess]) -> None:
    l1, l2 = nodes["l1"], nodes["l2"]
    bucket = "c" + unique("b")[-12:].replace("-", "").lower()
    assert call(l1, "PUT", f"/v1/buckets/{bucket}", OPERATOR)[0] == 201
    names = [f"team/{i:02d}" for i in range(16)] + [f"other/{i}" for i in range(4)]
    assert {shard_of(bucket, n, SHARDS) for n in names} == set(range(SHARDS))  # every shard holds some
    for n in names:
        status, _ = call(
            l2, "PUT", f"/v1/buckets/{bucket}/stream/{n}", {**OPERATOR, "Content-Type": "text/plain"}
        )
        assert status == 201
    for via in (l1, l2):
        assert pages(via, bucket, OPERATOR, 3) == sorted(names)
    # A token limited to team/ sees only team/, through either node, from every shard.
    status, token = call(
        l1, "POST", "/v1/admin/tokens", OPERATOR, {"bucket": bucket, "scope": "read", "prefix": "team"}
    )
    assert status == 201, token
    scoped = {"Authorization": f"Bearer {token['token']}"}
    for via in (l1, l2):
        assert pages(via, bucket, scoped, 5) == sorted(n for n in names if n.startswith("team/"))
        assert pages(via, bucket, scoped, 5, prefix="other") == []


def test_record_ordinals_survive_a_handoff_to_the_other_node(nodes: dict[str, ServerProcess]) -> None:
    """Ordinals are journal state: the node taking a shard over rebuilds them from the shard's WAL chain.

    Runs last in the module: it stops ``l2``, whose shards ``l1`` then serves.
    """
    l1, l2 = nodes["l1"], nodes["l2"]
    owned_by_l2 = {s for s, owner in enumerate(assignment(SHARDS, ["l1", "l2"])) if owner == "l2"}
    name = next(
        n for n in (unique("ord") for _ in range(1000)) if shard_of("default", n, SHARDS) in owned_by_l2
    )
    path = f"/v1/stream/{name}"
    json_ct = {**OPERATOR, "Content-Type": "application/json"}
    assert call(l1, "PUT", path, json_ct)[0] == 201
    for batch in ([0, 1], [2], [3, 4, 5]):
        status, _, _ = request("POST", l1.url + path, json_ct, json.dumps(batch).encode(), timeout=20)
        assert status == 204

    def records(via: ServerProcess) -> tuple[str, str, str]:
        deadline = Deadline(60)
        while True:
            status, h, _ = request("HEAD", via.url + path, OPERATOR, timeout=20)
            if status != 503 or deadline.expired():
                break
        assert status == 200
        return h["Stream-Record-First"], h["Stream-Record-Next"], h["Stream-Record-Count"]

    assert records(l1) == ("0", "6", "6")
    assert l2.stop() == 0  # hands its shards off
    wait_placed({"l1": l1}, SHARDS, 60, OPERATOR)
    assert records(l1) == ("0", "6", "6")
    status, h, body = request("GET", f"{l1.url}{path}?record=2", OPERATOR, timeout=20)
    assert status == 200 and h["Stream-Record"] == "2" and json.loads(body) == [2, 3, 4, 5]
    status, h, _ = request("POST", l1.url + path, {**json_ct, "Stream-Record-Match": "6"}, b"[6]", timeout=20)
    assert status == 204 and h["Stream-Record-Next"] == "7"
