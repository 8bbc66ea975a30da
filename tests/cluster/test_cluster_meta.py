"""Bucket-level metadata across nodes: quotas and usage per bucket, listings, /metrics, GC, groups over shards.

Two ``tiered serve`` nodes (``m1``, ``m2``) on one moto prefix, object-store
durability (shards follow placement), 4 shards: rendezvous hashing gives
shards 0 and 1 to ``m1`` and 2 and 3 to ``m2`` (pinned below), so every test
puts streams in shards owned by different nodes and asks through both.
The admin token is configured: admin routes, their sub-requests to every
shard and the nodes' listings of each other's streams all carry it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.engine.groups.test_groups_http import group_spec, member_view, strip_times, target
from tests.support.cluster_support import cluster_env, readiness, start_nodes, unique_prefix, wait_placed
from tests.support.deadlines import Deadline, scaled, wait_for
from tests.support.http_helpers import append, create, read, request, unique
from tests.support.s3_server import S3Endpoint
from tests.support.server_process import ServerProcess
from tiered.cluster.membership.placement import assignment
from tiered.cluster.membership.shards import shard_of
from tiered.core.ids import format_offset

pytestmark = pytest.mark.timeout(120)

SHARDS = 4
TOKEN = "meta-admin-token-0123456789"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
OWNERS = {0: "m1", 1: "m1", 2: "m2", 3: "m2"}


@pytest.fixture(scope="module")
def nodes(
    moto_s3: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, ServerProcess]]:
    assert dict(enumerate(assignment(SHARDS, ["m1", "m2"]))) == OWNERS
    with start_nodes(
        tmp_path_factory.mktemp("cluster-meta"),
        moto_s3,
        unique_prefix("meta"),
        ("m1", "m2"),
        env={**cluster_env(), "TIERED_ADMIN_TOKEN": TOKEN},
        shards=SHARDS,
        ttl_s=2.0,
        durability="object-store",
        extra=("--cluster-usage-interval-s", "0.2"),
    ) as started:
        wait_placed(started, SHARDS, 40)  # m1 serves shards 0-1, m2 2-3 (OWNERS)
        yield started


def call(
    srv: ServerProcess, method: str, path: str, body: Any = None, admin: bool = False
) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else b""
    headers = {"Content-Type": "application/json"} if data else {}
    if admin:
        headers.update(ADMIN)
    status, _, out = request(method, srv.url + path, headers, data, timeout=20)
    return status, (json.loads(out) if out else None)


def client_call(srv: ServerProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """``call``, retried on 503 + Retry-After as a client does (bounded). A node knows the shards' owners
    from their leases: just after a start (or a move) it may know no serving owner of a shard for a
    moment, and a group's decisions need every shard's streams, so it asks the caller to retry."""
    deadline = Deadline(30)
    while True:
        status, out = call(srv, method, path, body)
        if status != 503 or deadline.expired():
            return status, out
        time.sleep(min(float(out["error"].get("retry_after_s", 1)), 2.0))


def name_in(bucket: str, shard: int, prefix: str = "s") -> str:
    """A fresh stream name of ``bucket`` whose shard is ``shard``."""
    for _ in range(1000):
        name = unique(prefix)
        if shard_of(bucket, name, SHARDS) == shard:
            return name
    raise AssertionError("no name found")


def group_in(shard: int) -> str:
    for _ in range(1000):
        name = unique("g")
        if shard_of("default", "__groups/" + name, SHARDS) == shard:
            return name
    raise AssertionError("no group name found")


def rounds(srv: ServerProcess) -> int:
    return int(readiness(srv.url)["checks"]["usage_rounds"])  # type: ignore[index]


def until(check: Callable[[], bool], timeout: float = 20) -> None:
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def exchanged(nodes: dict[str, ServerProcess]) -> None:
    """Wait until each node published its current usage and read the other's (two full passes each, in turn)."""
    m1, m2 = nodes["m1"], nodes["m2"]
    for srv in (m1, m2, m1):
        start = rounds(srv)
        until(lambda srv=srv, start=start: rounds(srv) >= start + 2)  # type: ignore[misc]


# --------------------------------------------------------------------------- quotas and usage per bucket


def test_a_quota_holds_for_the_whole_bucket_over_shards_of_both_nodes(
    nodes: dict[str, ServerProcess],
) -> None:
    m1, m2 = nodes["m1"], nodes["m2"]
    bucket = "q" + unique("b")[-10:].replace("-", "")
    assert call(m2, "PUT", f"/v1/buckets/{bucket}")[0] == 201
    # Quotas go to every shard (each enforces them) and read back from any node.
    status, view = call(m1, "PUT", f"/v1/admin/quotas/{bucket}", {"max_streams": 4}, admin=True)
    assert status == 200 and view["overrides"] == {"max_streams": 4}, view
    for via in (m1, m2):
        status, view = call(via, "GET", f"/v1/admin/quotas/{bucket}", admin=True)
        assert (status, view["effective"]["max_streams"]) == (200, 4)
    assert call(m1, "PUT", f"/v1/admin/quotas/{bucket}", {"max_streams": 4})[0] == 401  # admin only

    # Two streams in m1's shards, two in m2's, each created through the other node.
    names = [name_in(bucket, 0), name_in(bucket, 1), name_in(bucket, 2), name_in(bucket, 3)]
    for i, name in enumerate(names):
        via = m2 if OWNERS[shard_of(bucket, name, SHARDS)] == "m1" else m1
        status, _, body = create(f"{via.url}/v1/buckets/{bucket}/stream/{name}", body=b"x" * (i + 1))
        assert status == 201, body
    exchanged(nodes)

    # The fifth stream is refused bucket-wide, in a shard of either node, as a single server refuses it.
    refusal = {
        "error": {
            "code": "QUOTA_EXCEEDED",
            "message": "this bucket may hold at most 4 streams",
            "quota": "max_streams",
            "limit": 4,
        }
    }
    for shard, via in ((0, m2), (3, m1), (2, m2)):
        status, _, body = create(f"{via.url}/v1/buckets/{bucket}/stream/{name_in(bucket, shard)}")
        assert (status, json.loads(body)) == (507, refusal)

    # Usage and the description sum every shard, through either node.
    for via in (m1, m2):
        status, desc = call(via, "GET", f"/v1/buckets/{bucket}")
        assert status == 200 and desc["name"] == bucket and desc["streams"] == 4, desc
        status, usage = call(via, "GET", f"/v1/admin/usage?bucket={bucket}", admin=True)
        assert status == 200 and len(usage["buckets"]) == 1, usage
        row = usage["buckets"][0]
        assert (row["bucket"], row["streams"], row["erased"]) == (bucket, 4, False)
        assert row["appended_bytes"] == 1 + 2 + 3 + 4 and row["appended_records"] == 4
        assert row["retained_bytes"]["hot"] + row["retained_bytes"]["cold"] == 10
    assert call(m1, "GET", "/v1/admin/usage?bucket=never-was", admin=True)[0] == 404

    # A stream deleted in m2's shard makes room in m1's once the usage went round.
    assert request("DELETE", f"{m1.url}/v1/buckets/{bucket}/stream/{names[3]}")[0] == 204
    exchanged(nodes)
    assert create(f"{m2.url}/v1/buckets/{bucket}/stream/{name_in(bucket, 1)}")[0] == 201
    exchanged(nodes)
    status, _, body = create(f"{m1.url}/v1/buckets/{bucket}/stream/{name_in(bucket, 2)}")
    assert (status, json.loads(body)) == (507, refusal)


# --------------------------------------------------------------------------- listings, /metrics, GC


def test_listings_metrics_and_gc_answer_for_every_shard(nodes: dict[str, ServerProcess]) -> None:
    m1, m2 = nodes["m1"], nodes["m2"]
    bucket = "l" + unique("b")[-10:].replace("-", "")
    assert call(m1, "PUT", f"/v1/buckets/{bucket}")[0] == 201
    status, listed = call(m1, "GET", "/v1/buckets")
    assert status == 200 and call(m2, "GET", "/v1/buckets") == (200, listed)
    names = [b["name"] for b in listed["buckets"]]
    assert names == sorted(names) and {"default", bucket} <= set(names)
    assert set(listed["buckets"][0]) == {"name", "created_ms"}

    # A bucket's settings go to every shard and read back from any node.
    status, retention = call(m2, "PUT", f"/v1/admin/retention/{bucket}", {"retention_ms": 60000}, admin=True)
    assert (status, retention) == (200, {"retention_ms": 60000, "retention_bytes": None})
    status, access = call(m2, "PUT", f"/v1/admin/access/{bucket}", {"public_read": True}, admin=True)
    assert status == 200 and call(m1, "GET", f"/v1/admin/access/{bucket}", admin=True) == (200, access)

    # Groups whose coordinators live in shards of both nodes, listed through either.
    groups = sorted([group_in(0), group_in(3)])
    for g in groups:
        assert call(m2, "PUT", f"/v1/groups/{g}", {"pattern": "nothing/*"})[0] == 201
    for via in (m1, m2):
        status, body = call(via, "GET", "/v1/groups")
        mine = [row for row in body["groups"] if row["group"] in groups]
        assert status == 200 and [row["group"] for row in mine] == groups
        assert mine[0] == {
            "group": groups[0],
            "bucket": "default",
            "incarnation": 1,
            "revision": 0,
            "members": 0,
            "targets": 0,
        }

    # /metrics: the node's own series and its shards' engines, admin-guarded as on a single server.
    assert request("GET", f"{m2.url}/metrics")[0] == 401
    status, headers, text = request("GET", f"{m2.url}/metrics", ADMIN)
    assert status == 200 and headers["Content-Type"].startswith("text/plain"), text[:200]
    body = text.decode()
    for line in (
        "tiered_cluster_shards 4.0",
        "tiered_cluster_shards_served 2.0",
        'tiered_cluster_shards_held{state="serving"} 2.0',
        "tiered_cluster_window_open 1.0",
        'tiered_cluster_shards_taken_total{from="takeover"} 0.0',
    ):
        assert line in body, line
    assert "process_cpu_seconds_total" in body and "tiered_cluster_forwarded_total" in body
    assert 'tiered_http_requests_total{route="/v1/groups",status="200"}' in body
    assert 'shard="0002"' in body and 'shard="0003"' in body and 'shard="0000"' not in body
    families = {f.name: f for f in text_string_to_metric_families(body)}  # a valid exposition
    assert len(families) == body.count("# TYPE ")  # one family per name, samples labelled by shard
    shards = {s.labels.get("shard") for f in families.values() for s in f.samples} - {None}
    assert shards == {"0002", "0003"}

    # GC: one pass per shard, one report in a single server's shape.
    status, report = call(m1, "POST", "/v1/admin/gc?dry_run=true", admin=True)
    assert status == 200, report
    assert report["dry_run"] is True and report["errors"] == [] and report["integrity_errors"] == []
    assert set(report) >= {"objects_deleted", "bytes_deleted", "orphans_found", "would_delete", "started_ms"}
    status, gc = call(m2, "POST", "/v1/admin/gc", admin=True)
    assert status == 200 and gc["dry_run"] is False and gc["errors"] == []
    status, state = call(m1, "GET", "/v1/admin/gc", admin=True)
    assert status == 200 and set(state) == {"pending_deletions", "totals", "last_pass"}
    assert state["totals"]["passes"] >= SHARDS and state["last_pass"]["dry_run"] is False
    assert call(m1, "POST", "/v1/admin/gc")[0] == 401


# --------------------------------------------------------------------------- a group over shards of both nodes


def wait_for_the_first_plan(via: ServerProcess, group: str) -> None:
    """Wait until the group sweeper made a new group's first plan (its targets, revision 1).

    A group is created without a plan; the sweeper (every 0.5 s) makes the first,
    unless a join made it first. Waiting for it makes every later revision and
    fence exact, whatever the load (a join racing the sweeper got revision 1 or 2).
    """

    def revision() -> int:
        status, desc = client_call(via, "GET", f"/v1/groups/{group}")
        assert status == 200, desc
        return int(desc["revision"])

    wait_for(lambda: revision() >= 1, 10, f"the sweeper's first plan of group {group!r}")
    assert revision() == 1


def test_a_group_consumes_streams_of_shards_owned_by_both_nodes(nodes: dict[str, ServerProcess]) -> None:
    m1, m2 = nodes["m1"], nodes["m2"]
    g = group_in(0)  # coordinated in m1's shard 0
    a, b = name_in("default", 1, "ga"), name_in("default", 2, "gb")  # m1's other shard, and m2's
    data = {a: b"0123456789", b: b"abc"}
    for name, body in data.items():
        assert create(f"{m2.url}/v1/stream/{name}", "text/plain", body)[0] == 201
    status, view = client_call(m2, "PUT", f"/v1/groups/{g}", {"streams": [b, a]})
    assert status == 201, view
    inc = view["incarnation"]
    assert [t["stream"] for t in view["targets"]] == sorted([a, b])
    wait_for_the_first_plan(m1, g)  # revision 1: the targets, nobody to hold them yet

    status, v1 = client_call(m2, "POST", f"/v1/groups/{g}/join", {"member": "w1", "join_id": "j1"})
    assert (status, v1) == (
        200,
        member_view(g, inc, 2, "w1", 1, sorted([(a, 2, 0, False), (b, 2, 0, False)])),
    )

    # The member reads each stream through any node and commits what it read.
    for name in (a, b):
        status, _, got = read(f"{m1.url}/v1/stream/{name}", format_offset(0))
        assert (status, got) == (200, data[name])
    beat = {"member": "w1", "incarnation": inc, "generation": 1}
    commits = [
        {"stream": a, "fence": 2, "offset": format_offset(10)},
        {"stream": b, "fence": 2, "offset": format_offset(3)},
    ]
    status, hb = client_call(m1, "POST", f"/v1/groups/{g}/heartbeat", {**beat, "commits": commits})
    assert (status, hb) == (
        200,
        member_view(g, inc, 2, "w1", 1, sorted([(a, 2, 10, False), (b, 2, 3, False)]), rejected=[]),
    )
    # Past the tail of a stream in another node's shard: refused item by item, as on a single server.
    over = [{"stream": b, "fence": 2, "offset": format_offset(4)}]
    status, hb = client_call(m2, "POST", f"/v1/groups/{g}/heartbeat", {**beat, "commits": over})
    assert status == 200 and hb["rejected"] == [
        {"stream": b, "code": "OFFSET_BEYOND_TAIL", "message": f"offset is beyond the tail of {b!r}"}
    ]
    # New data in m2's shard: the commit of what was just read is accepted (tails are asked fresh).
    assert append(f"{m1.url}/v1/stream/{b}", b"de", "text/plain")[0] == 204
    status, hb = client_call(
        m2,
        "POST",
        f"/v1/groups/{g}/heartbeat",
        {**beat, "commits": [{**over[0], "offset": format_offset(5)}]},
    )
    assert status == 200 and hb["rejected"] == []

    # A second member: the stream of the higher shard moves to it, intent first.
    status, v2 = client_call(m1, "POST", f"/v1/groups/{g}/join", {"member": "w2", "join_id": "j2"})
    assert (status, v2) == (200, member_view(g, inc, 3, "w2", 2, [], pending=[b]))
    release = {"commits": [], "releases": [{"stream": b, "fence": 2}]}
    status, hb = client_call(m2, "POST", f"/v1/groups/{g}/heartbeat", {**beat, **release})
    assert (status, hb) == (200, member_view(g, inc, 4, "w1", 1, [(a, 2, 10, False)], rejected=[]))
    beat2 = {"member": "w2", "incarnation": inc, "generation": 2}
    status, hb = client_call(m1, "POST", f"/v1/groups/{g}/heartbeat", beat2)
    assert (status, hb) == (200, member_view(g, inc, 4, "w2", 2, [(b, 4, 5, False)], rejected=[]))

    for via in (m1, m2):
        status, desc = client_call(via, "GET", f"/v1/groups/{g}")
        assert status == 200
        assert strip_times(desc) == {
            "group": g,
            "incarnation": inc,
            "revision": 4,
            **group_spec(streams=sorted([a, b])),
            "members": [{"member": "w1", "generation": 1}, {"member": "w2", "generation": 2}],
            "targets": sorted(
                [target(a, "w1", "w1", 2, 10, 10), target(b, "w2", "w2", 4, 5, 5)], key=lambda t: t["stream"]
            ),
        }
