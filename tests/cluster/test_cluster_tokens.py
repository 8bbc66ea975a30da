"""Issued tokens and node-to-node credentials across two nodes (``--auth tokens``, on moto).

Two ``tiered serve`` nodes (``m1``, ``m2``), object-store durability, 4
shards: rendezvous hashing gives shards 0 and 1 to ``t1`` and 2 and 3 to
``t2`` (pinned below). Small flush settings and no hot retention, so reads
of flushed data through the node that does not own the stream are catch-up
reads served from the store. The operator has an admin token (buckets need
one to be created); the nodes never send it to each other (their internal
requests are signed with the cluster secret). A second, smaller cluster has
no admin token at all and runs a consumer group over both nodes' streams.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.engine.groups.test_groups_http import member_view
from tests.support.cluster_support import cluster_env, start_nodes, unique_prefix, wait_placed
from tests.support.deadlines import Deadline, scaled, wait_for
from tests.support.http_helpers import request, unique
from tests.support.s3_server import S3Endpoint
from tests.support.server_process import ServerProcess
from tiered.cluster.membership.placement import assignment
from tiered.cluster.membership.shards import shard_of
from tiered.core.ids import format_offset

pytestmark = pytest.mark.timeout(120)

SHARDS = 4
ADMIN_TOKEN = "tokens-admin-token-0123456789"
OPERATOR = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
OWNERS = {0: "m1", 1: "m1", 2: "m2", 3: "m2"}
CHUNK = 4096
ZERO = format_offset(0)
BIN = {"Content-Type": "application/octet-stream"}
FORGED = "v1 ts={ts} nonce=00112233445566778899aabb marks= sig=" + "0" * 64


@contextmanager
def _started(
    base: Path, s3: S3Endpoint, names: tuple[str, str], env: dict[str, str], extra: tuple[str, ...]
) -> Iterator[dict[str, ServerProcess]]:
    """Two nodes, each serving its shards of OWNERS_OF(names); stopped on leaving."""
    with start_nodes(
        base, s3, unique_prefix("tokens"), names, env=env, shards=SHARDS, ttl_s=2.0, durability="object-store", extra=extra
    ) as started:  # fmt: skip
        wait_placed(started, SHARDS, 40, OPERATOR)
        yield started


def OWNERS_OF(names: tuple[str, str]) -> dict[int, str]:  # noqa: N802
    return dict(enumerate(assignment(SHARDS, list(names))))


@pytest.fixture(scope="module")
def nodes(
    moto_s3: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, ServerProcess]]:
    assert OWNERS_OF(("m1", "m2")) == OWNERS
    extra = (
        "--auth", "tokens",
        "--cluster-usage-interval-s", "0.2",
        "--flush-interval-s", "0.2", "--flush-bytes", "1024", "--hot-retention-s", "0",
        "--read-chunk-bytes", str(CHUNK),
    )  # fmt: skip
    env = {**cluster_env(), "TIERED_ADMIN_TOKEN": ADMIN_TOKEN}
    with _started(tmp_path_factory.mktemp("cluster-tokens"), moto_s3, ("m1", "m2"), env, extra) as started:
        yield started


def call(
    srv: ServerProcess, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else b""
    sent = {"Content-Type": "application/json"} if data else {}
    sent.update(headers or {})
    status, _, out = request(method, srv.url + path, sent, data, timeout=20)
    return status, (json.loads(out) if out else None)


def client_call(
    srv: ServerProcess, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    """``call``, retried on 503 + Retry-After as a client does (bounded). A node knows the shards' owners
    from their leases: just after a start (or a move) it may know no serving owner of a shard for a
    moment, and a group's decisions need every shard's streams, so it asks the caller to retry."""
    deadline = Deadline(30)
    while True:
        status, out = call(srv, method, path, body, headers)
        if status != 503 or deadline.expired():
            return status, out
        time.sleep(min(float(out["error"].get("retry_after_s", 1)), 2.0))


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def name_in(bucket: str, shard: int, prefix: str = "s") -> str:
    for _ in range(1000):
        name = unique(prefix)
        if shard_of(bucket, name, SHARDS) == shard:
            return name
    raise AssertionError("no name found")


def new_bucket(srv: ServerProcess) -> str:
    bucket = "k" + unique("b")[-12:].replace("-", "")
    assert call(srv, "PUT", f"/v1/buckets/{bucket}", headers=OPERATOR)[0] == 201
    return bucket


def issue(srv: ServerProcess, bucket: str, scope: str = "write", **extra: Any) -> dict[str, Any]:
    """Retried on 503 + Retry-After as a client does (a node's view of a shard that just moved may
    name no serving owner for a moment; an issue needs every shard)."""
    for _ in range(20):
        status, body = call(
            srv, "POST", "/v1/admin/tokens", {"bucket": bucket, "scope": scope, **extra}, OPERATOR
        )
        if status != 503:
            break
        time.sleep(float(body["error"]["retry_after_s"]))
    assert status == 201, body
    return body


def per_shard(srv: ServerProcess, path: str) -> list[tuple[int, Any]]:
    """``GET path`` answered by each shard's engine (``Tiered-Shard``), as the operator."""
    return [call(srv, "GET", path, headers={**OPERATOR, "Tiered-Shard": str(s)}) for s in range(SHARDS)]


def streams_of(bucket: str) -> dict[int, str]:
    return {s: name_in(bucket, s) for s in range(SHARDS)}


def url(srv: ServerProcess, bucket: str, name: str) -> str:
    return f"{srv.url}/v1/buckets/{bucket}/stream/{name}"


def code_of(body: bytes) -> str:
    return str(json.loads(body)["error"]["code"])


# --------------------------------------------------------------------------- issue, use, list


def test_a_token_issued_through_one_node_works_in_every_shard_through_both(
    nodes: dict[str, ServerProcess],
) -> None:
    t1, t2 = nodes["m1"], nodes["m2"]
    bucket = new_bucket(t1)
    minted = issue(t1, bucket, "write", name="ci")
    token, token_id = minted["token"], minted["id"]
    assert token.startswith(f"tdt_{token_id}_")
    assert {k: minted[k] for k in ("bucket", "scope", "prefix", "name", "expires_ms", "expired")} == {
        "bucket": bucket,
        "scope": "write",
        "prefix": None,
        "name": "ci",
        "expires_ms": None,
        "expired": False,
    }
    view = {k: v for k, v in minted.items() if k != "token"}
    # Installed on every shard, the identical record; listed and described through either node.
    assert per_shard(t2, f"/v1/admin/tokens/{token_id}") == [(200, view)] * SHARDS
    for via in (t1, t2):
        assert call(via, "GET", f"/v1/admin/tokens?bucket={bucket}", headers=OPERATOR) == (
            200,
            {"tokens": [view]},
        )
        status, listed = call(via, "GET", "/v1/admin/tokens", headers=OPERATOR)
        assert status == 200 and view in listed["tokens"]
        assert call(via, "GET", f"/v1/admin/tokens/{token_id}", headers=OPERATOR) == (200, view)
        assert call(via, "GET", f"/v1/admin/tokens?bucket={bucket}")[0] == 401  # operator only

    auth = bearer(token)
    data = {s: bytes([65 + s]) * (2 * CHUNK + 100) for s in range(SHARDS)}
    names = streams_of(bucket)
    for s, name in names.items():
        # Created through t1 (shards 2 and 3 forwarded to t2), appended through t2 (0 and 1 forwarded).
        assert request("PUT", url(t1, bucket, name), {**auth, **BIN})[0] == 201
        assert request("POST", url(t2, bucket, name), {**auth, **BIN}, data[s])[0] == 204
        for via in (t1, t2):
            status, _, got = request("GET", url(via, bucket, name) + f"?offset={ZERO}", auth)
            assert (status, got) == (200, data[s][:CHUNK])
            assert request("GET", url(via, bucket, name) + f"?offset={ZERO}")[0] == 401
    # A read-only token: reads everywhere, writes refused (403), exactly as on a single server.
    reader = bearer(issue(t2, bucket, "read")["token"])
    for name in names.values():
        for via in (t1, t2):
            assert request("GET", url(via, bucket, name) + f"?offset={ZERO}", reader)[0] == 200
            assert request("POST", url(via, bucket, name), {**reader, **BIN}, b"x")[0] == 403

    # Catch-up reads: flushed data of t2's streams read through t1, from the store, with the token.
    for s in (2, 3):
        served = _served_from_store(t1, url(t1, bucket, names[s]), auth)
        assert served == (200, data[s][CHUNK : 2 * CHUNK])


def _served_from_store(via: ServerProcess, stream: str, auth: dict[str, str]) -> tuple[int, bytes]:
    deadline = time.monotonic() + scaled(30)
    while True:
        status, headers, body = request("GET", stream + f"?offset={format_offset(CHUNK)}", auth)
        if headers.get("Tiered-Served-By") == "m1" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert headers.get("Tiered-Served-By") == "m1", (status, dict(headers))
    return status, body


# --------------------------------------------------------------------------- revoke and rotate


def test_a_token_revoked_through_the_other_node_is_refused_everywhere(
    nodes: dict[str, ServerProcess],
) -> None:
    t1, t2 = nodes["m1"], nodes["m2"]
    bucket = new_bucket(t2)
    minted = issue(t1, bucket)
    auth = bearer(minted["token"])
    names = streams_of(bucket)
    for name in names.values():
        assert request("PUT", url(t1, bucket, name), {**auth, **BIN}, bytes(2 * CHUNK + 100))[0] == 201
    # A catch-up read through t1 caches the owner's locator for this credential.
    assert _served_from_store(t1, url(t1, bucket, names[2]), auth)[0] == 200

    assert request("DELETE", f"{t2.url}/v1/admin/tokens/{minted['id']}", OPERATOR)[0] == 204
    for s, name in names.items():
        for via in (t1, t2):
            status, headers, body = request("GET", url(via, bucket, name) + f"?offset={ZERO}", auth)
            assert (status, code_of(body)) == (401, "UNAUTHORIZED"), (s, via.url)
            assert headers.get("WWW-Authenticate", "").startswith("Bearer")
            assert request("POST", url(via, bucket, name), {**auth, **BIN}, b"x")[0] == 401
    # The cached locator does not outlive the revocation.
    status, _, _ = request("GET", url(t1, bucket, names[2]) + f"?offset={format_offset(CHUNK)}", auth)
    assert status == 401
    assert [status for status, _ in per_shard(t1, f"/v1/admin/tokens/{minted['id']}")] == [404] * SHARDS
    status, body = call(t1, "DELETE", f"/v1/admin/tokens/{minted['id']}", headers=OPERATOR)
    assert (status, body["error"]["code"]) == (404, "TOKEN_NOT_FOUND")


def test_a_rotated_token_works_on_both_nodes_and_the_old_one_ends(nodes: dict[str, ServerProcess]) -> None:
    t1, t2 = nodes["m1"], nodes["m2"]
    bucket = new_bucket(t1)
    old = issue(t2, bucket, prefix="logs")
    names: dict[int, str] = {}
    for s in range(SHARDS):
        while s not in names:
            candidate = "logs/" + unique("r")
            if shard_of(bucket, candidate, SHARDS) == s:
                names[s] = candidate
    # With a grace period: both work meanwhile.
    status, graced = call(t1, "POST", f"/v1/admin/tokens/{old['id']}/rotate", {"grace_s": 600}, OPERATOR)
    assert status == 201 and graced["replaces"] == old["id"], graced
    assert {k: graced[k] for k in ("bucket", "scope", "prefix")} == {
        "bucket": bucket,
        "scope": "write",
        "prefix": "logs",
    }
    for name in names.values():
        assert request("PUT", url(t1, bucket, name), {**bearer(graced["token"]), **BIN})[0] == 201
        for via in (t1, t2):
            for token in (old["token"], graced["token"]):
                assert request("GET", url(via, bucket, name) + f"?offset={ZERO}", bearer(token))[0] == 200
    # Without: the old one ends at once on every shard, the new one works through both nodes.
    status, now = call(t2, "POST", f"/v1/admin/tokens/{graced['id']}/rotate", None, OPERATOR)
    assert status == 201 and now["replaces"] == graced["id"]
    for name in names.values():
        for via in (t1, t2):
            assert request("POST", url(via, bucket, name), {**bearer(now["token"]), **BIN}, b"z")[0] == 204
            assert (
                request("GET", url(via, bucket, name) + f"?offset={ZERO}", bearer(graced["token"]))[0] == 401
            )
    # The grace rotation shortened the first token to 600 s on every shard: listed alike everywhere.
    listed = per_shard(t1, f"/v1/admin/tokens?bucket={bucket}")
    assert all(answer == listed[0] for answer in listed)
    assert sorted(t["id"] for t in listed[0][1]["tokens"]) == sorted([old["id"], now["id"]])
    assert call(t1, "POST", "/v1/admin/tokens/aaaaaaaaaaaaaaaaaaaa/rotate", None, OPERATOR)[0] == 404


def test_a_shard_refusing_the_install_leaves_no_usable_token(nodes: dict[str, ServerProcess]) -> None:
    t1, t2 = nodes["m1"], nodes["m2"]
    bucket = new_bucket(t1)
    home = shard_of(bucket, "", SHARDS)
    other = next(s for s in (2, 3, 0, 1) if s != home)
    # The bucket erased on one shard only (a sub-request aimed at it): that shard refuses the install.
    status, _, _ = request(
        "DELETE", f"{t1.url}/v1/buckets/{bucket}", {**OPERATOR, "Tiered-Shard": str(other)}
    )
    assert status == 204
    before = per_shard(t2, f"/v1/admin/tokens?bucket={bucket}")
    for via in (t1, t2):
        status, headers, body = request(
            "POST",
            f"{via.url}/v1/admin/tokens",
            {**OPERATOR, "Content-Type": "application/json"},
            json.dumps({"bucket": bucket, "scope": "write"}).encode(),
        )
        assert (status, code_of(body)) == (503, "UNAVAILABLE"), body
        assert headers.get("Retry-After") and b"tdt_" not in body
    # Rolled back on every shard: no token left anywhere (and its secret was never shown).
    assert per_shard(t2, f"/v1/admin/tokens?bucket={bucket}") == before
    assert all(answer == (200, {"tokens": []}) for answer in before if answer[0] == 200)
    # A bucket the well-known shard does not know: its single-server refusal, nothing installed.
    status, body = call(
        t2, "POST", "/v1/admin/tokens", {"bucket": "nosuchbucket9", "scope": "read"}, OPERATOR
    )
    assert (status, body["error"]["code"]) == (404, "BUCKET_NOT_FOUND")
    status, body = call(t2, "POST", "/v1/admin/tokens", {"bucket": bucket, "scope": "root"}, OPERATOR)
    assert status == 400


# --------------------------------------------------------------------------- node-to-node credentials


def test_internal_routes_refuse_clients_and_forged_signatures(nodes: dict[str, ServerProcess]) -> None:
    t1, t2 = nodes["m1"], nodes["m2"]
    ts = int(time.time() * 1000)
    forged = {"Tiered-Node-Signature": FORGED.format(ts=ts)}
    listing = "/v1/cluster/shards/2/streams?bucket=default"
    for via in (t1, t2):
        for headers in ({}, OPERATOR, forged, {**OPERATOR, **forged}):
            status, _, body = request("GET", via.url + listing, headers)
            assert (status, code_of(body)) == (401, "UNAUTHORIZED"), (via.url, headers)
    # Installing a token record (a hash the caller chose) is for nodes only, even for the operator.
    install = {
        "bucket": "default",
        "scope": "admin",
        "prefix": None,
        "name": None,
        "created_ms": ts,
        "expires_ms": None,
        "secret_sha256": "00" * 32,
    }
    for headers in (OPERATOR, {**OPERATOR, **forged}):
        status, body = call(t1, "PUT", "/v1/admin/tokens/aaaaaaaaaaaaaaaaaaaa", install, headers)
        assert (status, body["error"]["code"]) == (401, "UNAUTHORIZED")
        for s in range(SHARDS):
            status, body = call(
                t2,
                "PUT",
                "/v1/admin/tokens/aaaaaaaaaaaaaaaaaaaa",
                install,
                {**headers, "Tiered-Shard": str(s)},
            )
            assert (status, body["error"]["code"]) == (401, "UNAUTHORIZED")
    assert per_shard(t1, "/v1/admin/tokens/aaaaaaaaaaaaaaaaaaaa")[0][0] == 404
    # A forged signature on an ordinary request: refused, never a 500, wherever the shard is served.
    for s in range(SHARDS):
        name = name_in("default", s)
        status, _, body = request("PUT", f"{t1.url}/v1/stream/{name}", {**OPERATOR, **BIN, **forged})
        assert (status, code_of(body)) == (401, "UNAUTHORIZED")
        stale = {"Tiered-Node-Signature": FORGED.format(ts=ts - 3_600_000)}
        assert (
            request("GET", f"{t2.url}/v1/buckets/default", {**OPERATOR, **stale, "Tiered-Shard": str(s)})[0]
            == 401
        )


def test_a_fanned_out_request_is_counted_once_in_the_bucket(nodes: dict[str, ServerProcess]) -> None:
    t1, t2 = nodes["m1"], nodes["m2"]
    bucket = new_bucket(t1)
    token = bearer(issue(t1, bucket, "admin")["token"])

    def admin_requests() -> int:
        status, body = call(t2, "GET", f"/v1/admin/usage?bucket={bucket}", headers=OPERATOR)
        assert status == 200, body
        rows = body["buckets"] if isinstance(body, dict) and "buckets" in body else body
        row = rows[0] if isinstance(rows, list) else rows
        return int(row["requests"]["admin"])

    before = admin_requests()
    for via in (t1, t2, t1):  # a description: asked of every shard, counted in one
        assert call(via, "GET", f"/v1/buckets/{bucket}", headers=token)[0] == 200
    assert call(t2, "PUT", f"/v1/admin/quotas/{bucket}", {"max_streams": 100}, OPERATOR)[0] == 200
    assert admin_requests() - before == 3


# --------------------------------------------------------------------------- groups with a bucket's token only


def wait_for_the_first_plan(via: ServerProcess, group: str, headers: dict[str, str]) -> None:
    """Wait until the group sweeper made a new group's first plan (its targets, revision 1).

    A group is created without a plan; the sweeper (every 0.5 s) makes the first,
    unless a join made it first. Waiting for it makes every later revision and
    fence exact, whatever the load (a join racing the sweeper got revision 1 or 2).
    """

    def revision() -> int:
        status, desc = client_call(via, "GET", f"/v1/groups/{group}", headers=headers)
        assert status == 200, desc
        return int(desc["revision"])

    wait_for(lambda: revision() >= 1, 10, f"the sweeper's first plan of group {group!r}")
    assert revision() == 1


def test_groups_span_nodes_with_auth_on_and_a_bucket_token(
    moto_s3: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Groups across nodes need nothing but the caller's bucket token (the admin token only mints it)."""
    names = ("m1", "m2")
    env = {**cluster_env(), "TIERED_ADMIN_TOKEN": ADMIN_TOKEN}
    with _started(
        tmp_path_factory.mktemp("cluster-tokens-groups"), moto_s3, names, env, ("--auth", "tokens")
    ) as started:
        g1, g2 = started["m1"], started["m2"]
        # Auth on: the operator's routes need the admin token, on loopback too.
        refused = client_call(g2, "POST", "/v1/admin/tokens", {"bucket": "default", "scope": "admin"})
        assert (refused[0], refused[1]["error"]["code"]) == (401, "UNAUTHORIZED"), refused
        minted = client_call(
            g2, "POST", "/v1/admin/tokens", {"bucket": "default", "scope": "admin"}, OPERATOR
        )
        assert minted[0] == 201, minted
        auth = bearer(minted[1]["token"])
        group = next(
            g for g in (unique("g") for _ in range(1000)) if shard_of("default", "__groups/" + g, SHARDS) == 0
        )
        a, b = name_in("default", 1, "ga"), name_in("default", 2, "gb")  # t1's other shard, and t2's
        for name, body in ((a, b"0123456789"), (b, b"abc")):
            status, _, _ = request(
                "PUT", f"{g2.url}/v1/stream/{name}", {**auth, "Content-Type": "text/plain"}, body
            )
            assert status == 201
        status, view = client_call(g2, "PUT", f"/v1/groups/{group}", {"streams": [b, a]}, auth)
        assert status == 201, view
        assert [t["stream"] for t in view["targets"]] == sorted([a, b])
        inc = view["incarnation"]
        wait_for_the_first_plan(g1, group, auth)  # revision 1: the targets, nobody to hold them yet
        status, joined = client_call(
            g2, "POST", f"/v1/groups/{group}/join", {"member": "w1", "join_id": "j1"}, auth
        )
        assert (status, joined) == (
            200,
            member_view(group, inc, 2, "w1", 1, sorted([(a, 2, 0, False), (b, 2, 0, False)])),
        )
        commits = [{"stream": b, "fence": 2, "offset": format_offset(3)}]
        beat = {"member": "w1", "incarnation": inc, "generation": 1, "commits": commits}
        status, hb = client_call(g1, "POST", f"/v1/groups/{group}/heartbeat", beat, auth)
        assert (status, hb) == (
            200,
            member_view(group, inc, 2, "w1", 1, sorted([(a, 2, 0, False), (b, 2, 3, False)]), rejected=[]),
        )
        assert (
            client_call(g1, "POST", f"/v1/groups/{group}/join", {"member": "w2", "join_id": "j2"})[0] == 401
        )


# --------------------------------------------------------------------------- catch-up reads in the bucket's usage


def test_catch_up_reads_served_by_a_non_owner_are_counted_once(nodes: dict[str, ServerProcess]) -> None:
    t1, t2 = nodes["m1"], nodes["m2"]
    bucket = new_bucket(t1)
    auth = bearer(issue(t1, bucket, "write")["token"])
    name = name_in(bucket, 2)  # m2's shard: m1 serves its cold reads from the store
    data = bytes(range(256)) * 40  # 10240 bytes: 2.5 chunks
    assert request("PUT", url(t2, bucket, name), {**auth, **BIN}, data)[0] == 201
    reads = egress = served = 0
    deadline = time.monotonic() + scaled(30)
    while served < 3 and time.monotonic() < deadline:
        status, headers, body = request(
            "GET", url(t1, bucket, name) + f"?offset={format_offset(CHUNK)}", auth
        )
        assert (status, body) == (200, data[CHUNK : 2 * CHUNK])
        reads, egress = reads + 1, egress + len(body)
        served += headers.get("Tiered-Served-By") == "m1"
        time.sleep(0.05)
    assert served == 3  # the last reads came from the store, without the owner
    status, _, body = request("GET", url(t2, bucket, name) + f"?offset={ZERO}", auth)  # one from the owner
    reads, egress = reads + 1, egress + len(body)

    def counted(via: ServerProcess) -> tuple[int, int]:
        status, out = call(via, "GET", f"/v1/admin/usage?bucket={bucket}", headers=OPERATOR)
        assert status == 200, out
        (row,) = out["buckets"]
        return row["requests"]["read"], row["egress_bytes"]["hot"] + row["egress_bytes"]["cold"]

    for via in (t2, t1):  # m2 knows m1's reads once m1 published them (every 0.2 s)
        deadline = time.monotonic() + scaled(15)
        while counted(via) != (reads, egress) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert counted(via) == (reads, egress)
