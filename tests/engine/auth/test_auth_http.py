"""Every route x every kind of credential -> the exact status, on both HTTP adapters; refusals change nothing.

One server per adapter runs ``--auth jwt`` (tiered tokens and JWTs both
work there). Credentials are tokens scoped to bucket ``acme`` (read, write,
admin), one scoped to another bucket, and ones that are not valid (no
header, a made-up token, an expired one, a revoked one, JWTs with the wrong
``aud`` or ``iss``, expired, not yet valid, a bad signature, ``alg: none``),
plus a valid JWT granting admin on ``acme``.

Every cell runs twice: as written, and *encoded*: every character of every
path segment (names and literal segments alike), of every query name and
value and of the path in ``Stream-Forked-From`` percent-encoded, hex digits in
mixed case; it must get exactly the same answer. And the matrix runs again
with ``acme`` and ``default`` public-read: reads of streams and the bucket's
description open to anyone, every route that changes state exactly as before.

For each cell: the status is exactly the expected one; a refusal (401, 403,
404) leaves the world as it was (buckets, groups, tokens, every bucket's
usage, streams and bytes, as the operator sees them); a 404 is byte for byte
what the same request gets for a bucket, group or subscription that does not
exist; a 401 carries ``WWW-Authenticate: Bearer``; no body ever echoes a
credential.
"""

from __future__ import annotations

import http.client
import itertools
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from joserfc.jwk import RSAKey

from tests.support.auth_support import OPERATOR, AuthServer, bearer
from tests.support.http_helpers import request

pytestmark = pytest.mark.timeout(300)

_n = itertools.count()
TEXT = {"Content-Type": "text/plain"}


@dataclass
class Route:
    name: str
    method: str
    path: str  # {i}: a fresh number per call
    headers: dict[str, str]
    body: bytes
    # Expected status for: read, write, admin (and the valid JWT, which grants admin).
    read: int
    write: int
    admin: int
    ghost: Callable[[str], str] | None = None  # the same path naming something that does not exist
    setup: Callable[[AuthServer, str], None] | None = None  # run (as the operator) before the call
    kind: str = "bucket"  # bucket | any | operator | open | default (scope on the default bucket)


def _create_victim(srv: AuthServer, path: str) -> None:
    status, _, body = request("PUT", srv.url + path, {**OPERATOR, **TEXT}, b"v")
    assert status == 201, body


def _create_group(srv: AuthServer, path: str) -> None:
    status, body = srv.admin("PUT", path, {"bucket": "acme", "pattern": "data/*"})
    assert status == 201, body


def _ghost_bucket(path: str) -> str:
    return path.replace("/acme", "/ghost-bucket")


S = "/v1/buckets/acme/stream/data/s"
# Members joined by the join-group cells stay live the whole run (the world counts live members).
G_ACME = {"bucket": "acme", "pattern": "data/*", "session_timeout_ms": 600_000}
ROUTES = [
    Route("read", "GET", S + "?offset=-1", {}, b"", 200, 200, 200, _ghost_bucket),
    Route("head", "HEAD", S, {}, b"", 200, 200, 200, _ghost_bucket),
    Route("long-poll", "GET", S + "?offset=-1&live=long-poll", {}, b"", 200, 200, 200, _ghost_bucket),
    Route("sse", "GET", S + "?offset=-1&live=sse", {}, b"", 200, 200, 200, _ghost_bucket),
    Route("create", "PUT", "/v1/buckets/acme/stream/data/new-{i}", TEXT, b"x", 403, 201, 201, _ghost_bucket),
    Route("append", "POST", S, TEXT, b"more", 403, 204, 204, _ghost_bucket),
    Route(
        "delete",
        "DELETE",
        "/v1/buckets/acme/stream/data/del-{i}",
        {},
        b"",
        403,
        204,
        204,
        _ghost_bucket,
        setup=_create_victim,
    ),
    Route(
        "fork",
        "PUT",
        "/v1/buckets/acme/stream/data/fork-{i}",
        {"Stream-Forked-From": S},
        b"",
        403,
        201,
        201,
        _ghost_bucket,
    ),
    Route("list-buckets", "GET", "/v1/buckets", {}, b"", 200, 200, 200, kind="any"),
    Route("describe-bucket", "GET", "/v1/buckets/acme", {}, b"", 200, 200, 200, _ghost_bucket),
    # (no ghost: the operator would create it; test_hidden_bucket_creation covers it)
    Route("create-bucket", "PUT", "/v1/buckets/acme", {}, b"", 403, 403, 200),
    Route("erase-bucket", "DELETE", "/v1/buckets/acme", {}, b"", 401, 401, 401, kind="operator"),
    Route("list-groups", "GET", "/v1/groups", {}, b"", 200, 200, 200, kind="any"),
    Route(
        "describe-group",
        "GET",
        "/v1/groups/g-acme",
        {},
        b"",
        200,
        200,
        200,
        lambda p: p.replace("g-acme", "g-ghost"),
    ),
    Route(
        "create-group",
        "PUT",
        "/v1/groups/g-acme",
        {"Content-Type": "application/json"},
        json.dumps(G_ACME).encode(),
        403,
        403,
        200,
        lambda p: p,  # see test_hidden_group_creation_looks_like_a_missing_bucket
    ),
    Route(
        "join-group",
        "POST",
        "/v1/groups/g-acme/join",
        {"Content-Type": "application/json"},
        b'{"member": "m", "join_id": "j-{i}"}',
        200,
        200,
        200,
        lambda p: p.replace("g-acme", "g-ghost"),
    ),
    Route(
        "link-group",
        "POST",
        "/v1/groups/g-acme/streams",
        {"Content-Type": "application/json"},
        b'{"streams": ["data/s"]}',
        403,
        403,
        200,
        lambda p: p.replace("g-acme", "g-ghost"),
    ),
    Route(
        "heartbeat",
        "POST",
        "/v1/groups/g-acme/heartbeat",
        {"Content-Type": "application/json"},
        b'{"member": "nobody", "incarnation": 1, "generation": 1}',
        409,  # past auth: the route's own answer (not a member)
        409,
        409,
        lambda p: p.replace("g-acme", "g-ghost"),
    ),
    Route(
        "leave-group",
        "POST",
        "/v1/groups/g-acme/leave",
        {"Content-Type": "application/json"},
        b'{"member": "nobody", "incarnation": 1, "generation": 1}',
        200,  # leaving when not a member is a no-op
        200,
        200,
        lambda p: p.replace("g-acme", "g-ghost"),
    ),
    Route(
        "unlink-group",
        "DELETE",
        "/v1/groups/g-acme/streams/data%2Fs",
        {},
        b"",
        403,
        403,
        200,
        lambda p: p.replace("g-acme", "g-ghost"),
    ),
    Route(
        "delete-group",
        "DELETE",
        "/v1/groups/g-del-{i}",
        {},
        b"",
        403,
        403,
        204,
        lambda p: "/v1/groups/g-ghost",
        setup=lambda srv, path: _create_group(srv, path),
    ),
    Route(
        "create-subscription",
        "PUT",
        "/v1/stream/__ds/subscriptions/s-{i}",
        {"Content-Type": "application/json"},
        b'{"type": "pull-wake", "pattern": "jobs/*", "wake_stream": "wakes"}',
        404,
        404,
        404,
        kind="default",  # (no ghost: the operator would create it)
    ),
    Route(
        "subscription",
        "GET",
        "/v1/stream/__ds/subscriptions/sub1",
        {},
        b"",
        404,
        404,
        404,
        lambda p: p.replace("sub1", "ghost-sub"),
        kind="default",
    ),
    Route(
        "claim",
        "POST",
        "/v1/stream/__ds/subscriptions/sub1/claim",
        {"Content-Type": "application/json"},
        b'{"worker": "w"}',
        404,
        404,
        404,
        lambda p: p.replace("sub1", "ghost-sub"),
        kind="default",
    ),
    Route(
        "default-stream",
        "GET",
        "/v1/stream/jobs/a?offset=-1",
        {},
        b"",
        404,
        404,
        404,
        lambda p: p.replace("jobs/a", "jobs/ghost"),
        kind="default",
    ),
    Route("usage", "GET", "/v1/admin/usage", {}, b"", 401, 401, 401, kind="operator"),
    Route(
        "retention",
        "PUT",
        "/v1/admin/retention/acme",
        {"Content-Type": "application/json"},
        b'{"retention_ms": 1}',
        401,
        401,
        401,
        kind="operator",
    ),
    Route(
        "quotas", "PUT", "/v1/admin/quotas/acme", {}, b'{"max_streams": 0}', 401, 401, 401, kind="operator"
    ),
    Route(
        "issue-token",
        "POST",
        "/v1/admin/tokens",
        {},
        b'{"bucket":"acme","scope":"admin"}',
        401,
        401,
        401,
        kind="operator",
    ),
    Route("metrics", "GET", "/metrics", {}, b"", 401, 401, 401, kind="operator"),
    Route("healthz", "GET", "/healthz", {}, b"", 200, 200, 200, kind="open"),
    Route("preflight", "OPTIONS", S, {}, b"", 204, 204, 204, kind="open"),
]

VALID = ("read", "write", "admin", "jwt-admin")
INVALID = (
    "none",
    "malformed",
    "made-up",
    "expired",
    "revoked",
    "jwt-wrong-aud",
    "jwt-wrong-iss",
    "jwt-expired",
    "jwt-not-yet-valid",
    "jwt-bad-signature",
    "jwt-alg-none",
)
CREDENTIALS = (*VALID, "other-bucket", *INVALID)


def expected(route: Route, cred: str) -> int:
    if route.kind == "open":
        return route.read
    if cred in INVALID:
        return 401
    if route.kind == "operator":
        return 401
    if route.kind == "any":
        return 200
    if cred == "other-bucket":
        return 404
    level = "admin" if cred == "jwt-admin" else cred
    return int(getattr(route, level))


def _escape(text: str, n: itertools.count[int]) -> str:
    """Every character percent-encoded; hex digits upper or lower case in turn."""
    out = []
    for byte in text.encode("utf-8"):
        digits = f"{byte:02X}"
        out.append("%" + (digits.lower() if next(n) % 2 else digits))
    return "".join(out)


def encode_path(path: str) -> str:
    """``path`` (a path, maybe with a query) with every character of every segment, query name and value encoded."""
    n = itertools.count()
    raw, _, query = path.partition("?")
    out = "/".join(_escape(unquote(segment), n) for segment in raw.split("/"))
    if query:
        pairs = (pair.partition("=") for pair in query.split("&"))
        out += "?" + "&".join(f"{_escape(unquote(k), n)}={_escape(unquote(v), n)}" for k, _, v in pairs)
    return out


def spell(route: Route, path: str, spelling: str) -> tuple[str, dict[str, str]]:
    """The path and headers to send: as written, or ``encoded``."""
    if spelling == "plain":
        return path, route.headers
    headers = dict(route.headers)
    if "Stream-Forked-From" in headers:
        headers["Stream-Forked-From"] = encode_path(headers["Stream-Forked-From"])
    return encode_path(path), headers


def call(
    srv: AuthServer,
    route: Route,
    path: str,
    headers: dict[str, str],
    route_headers: dict[str, str] | None = None,
) -> tuple[int, Any, bytes]:
    """One request; for SSE only the status and headers (the body would stream on)."""
    route_headers = route.headers if route_headers is None else route_headers
    if route.name != "sse":
        body = route.body.replace(b"{i}", str(next(_n)).encode())
        return request(route.method, srv.url + path, {**route_headers, **headers}, body)
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=15)
    try:
        conn.request(route.method, path, headers={**route_headers, **headers})
        resp = conn.getresponse()
        data = resp.read() if resp.status != 200 else b""
        return resp.status, resp.headers, data
    finally:
        conn.close()


def world(srv: AuthServer) -> Any:
    """Everything a refusal must not change, as the operator sees it (through uncounted routes)."""
    out = []
    for path in ("/v1/buckets", "/v1/groups", "/v1/admin/tokens", "/v1/admin/usage"):
        status, _, body = request("GET", srv.url + path, OPERATOR)
        assert status == 200, body
        view = json.loads(body)
        if path == "/v1/groups":  # the sweeper links new streams in the background: not a change of ours
            view = [(g["group"], g["bucket"], g["incarnation"], g["members"]) for g in view["groups"]]
        if path == "/v1/admin/usage":  # the flusher moves bytes from hot to cold: the sum is what counts
            for row in view["buckets"]:
                row["retained_bytes"] = sum(row["retained_bytes"].values())
        out.append(view)
    return out


@pytest.fixture(scope="module", params=["granian", "aiohttp"])
def setup(
    request_: Any = None, *, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[AuthServer, dict[str, dict[str, str]]]]:  # noqa: E501
    srv = AuthServer(
        tmp_path_factory.mktemp(f"auth-{request.param}") / "data",
        "--http-server",
        request.param,
        "--long-poll-timeout-s",
        "1",
        "--sse-max-connection-s",
        "1",
    ).start()
    try:
        yield srv, _populate(srv)
    finally:
        srv.stop()


def _populate(srv: AuthServer) -> dict[str, dict[str, str]]:
    srv.bucket("acme")
    srv.bucket("other")
    for url, ctype, body in (
        (srv.url + S, "text/plain", b"hello"),
        (srv.url + "/v1/buckets/other/stream/o/s", "text/plain", b"theirs"),
        (srv.url + "/v1/stream/wakes", "application/json", b""),
        (srv.url + "/v1/stream/jobs/a", "text/plain", b"job"),
    ):
        status, _, resp = request("PUT", url, {**OPERATOR, "Content-Type": ctype}, body)
        assert status == 201, resp
    assert srv.admin("PUT", "/v1/groups/g-acme", G_ACME)[0] == 201
    sub = {"type": "pull-wake", "pattern": "jobs/*", "wake_stream": "wakes"}
    assert srv.admin("PUT", "/v1/stream/__ds/subscriptions/sub1", sub)[0] == 201
    creds: dict[str, dict[str, str]] = {"none": {}, "malformed": {"Authorization": "Basic dXNlcjpwYXNz"}}
    for scope in ("read", "write", "admin"):
        creds[scope] = bearer(srv.token("acme", scope)["token"])
    creds["other-bucket"] = bearer(srv.token("other", "admin")["token"])
    creds["made-up"] = bearer("tdt_" + "a" * 20 + "_" + "b" * 43)
    expiring = srv.token("acme", "admin", ttl_s=1)
    revoked = srv.token("acme", "admin")
    assert srv.admin("DELETE", f"/v1/admin/tokens/{revoked['id']}")[0] == 204
    creds["expired"] = bearer(expiring["token"])
    creds["revoked"] = bearer(revoked["token"])
    now = int(time.time())
    grant = "openid tiered:acme:admin"
    creds["jwt-admin"] = bearer(srv.jwt(grant))
    creds["jwt-wrong-aud"] = bearer(srv.jwt(grant, aud="someone-else"))
    creds["jwt-wrong-iss"] = bearer(srv.jwt(grant, iss="https://evil.test"))
    creds["jwt-expired"] = bearer(srv.jwt(grant, exp=now - 5))
    creds["jwt-not-yet-valid"] = bearer(srv.jwt(grant, nbf=now + 600))
    creds["jwt-bad-signature"] = bearer(
        srv.jwt(grant, key=RSAKey.generate_key(2048, parameters={"kid": "test-1"}))
    )
    creds["jwt-alg-none"] = bearer(srv.unsigned_jwt(grant))
    time.sleep(max(0.0, expiring["expires_ms"] / 1000 - time.time()) + 0.05)
    return creds


def check_cells(
    srv: AuthServer,
    creds: dict[str, dict[str, str]],
    route: Route,
    spelling: str,
    credentials: tuple[str, ...],
    want_of: Callable[[Route, str], int],
) -> list[str]:
    """Each credential's call of ``route``: the exact status, nothing changed on refusal, 404s as for nothing."""
    failures = []
    for cred in credentials:
        path = route.path.replace("{i}", str(next(_n)))
        if route.setup is not None:
            route.setup(srv, path)
        want = want_of(route, cred)
        before = world(srv) if want in (401, 403, 404) else None
        sent, route_headers = spell(route, path, spelling)
        status, headers, body = call(srv, route, sent, creds[cred], route_headers)
        if status != want:
            failures.append(f"{cred}: {status} (want {want}) {body[:200]!r}")
            continue
        for secret in creds[cred].values():
            assert secret.split()[-1].encode() not in body, f"{cred}: a credential in the body"
        if status == 401:
            assert headers.get("WWW-Authenticate", "").startswith("Bearer"), cred
        if before is not None:
            assert world(srv) == before, f"{route.name} x {cred}: a refusal changed something"
        if status == 404 and route.ghost is not None and route.name != "create-group":
            # Byte for byte what a missing one gets (names differ only where the request names them).
            g_path, g_headers = spell(route, route.ghost(path), spelling)
            g_status, _, g_body = call(srv, route, g_path, OPERATOR, g_headers)
            real_group = path.split("/")[3].encode() if path.startswith("/v1/groups/") else b"g-acme"
            for ghost, real in (
                (b"ghost-bucket", b"acme"),
                (b"g-ghost", real_group),
                (b"ghost-sub", b"sub1"),
            ):
                g_body = g_body.replace(ghost, real)
            assert (g_status, g_body) == (status, body), (
                f"{route.name} x {cred}: 404 differs from a missing one"
            )
    return failures


SPELLINGS = ("plain", "encoded")


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("route", ROUTES, ids=[r.name for r in ROUTES])
def test_route_by_credential(
    setup: tuple[AuthServer, dict[str, dict[str, str]]], route: Route, spelling: str
) -> None:
    srv, creds = setup
    failures = check_cells(srv, creds, route, spelling, CREDENTIALS, expected)
    assert not failures, f"{route.name} ({spelling}):\n" + "\n".join(failures)


#: What public read opens to anyone: reading streams (catch-up and live) and describing the bucket.
PUBLIC_READS = frozenset({"read", "head", "long-poll", "sse", "describe-bucket", "default-stream"})


def expected_public(route: Route, cred: str) -> int:
    if route.name in PUBLIC_READS and (cred == "none" or cred not in INVALID):
        return (
            200  # anyone, with no credential or any valid one; a credential that is not valid is still a 401
        )
    return expected(route, cred)


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_public_read_opens_reads_and_nothing_that_changes_state(
    setup: tuple[AuthServer, dict[str, dict[str, str]]], spelling: str
) -> None:
    """``acme`` and ``default`` public-read: every route x the callers public read could let in."""
    srv, creds = setup
    for bucket in ("acme", "default"):
        assert srv.admin("PUT", f"/v1/admin/access/{bucket}", {"public_read": True})[0] == 200
    try:
        failures = []
        for route in ROUTES:
            cells = check_cells(
                srv, creds, route, spelling, ("none", "other-bucket", "read", "made-up"), expected_public
            )
            failures += [f"{route.name} ({spelling}): {f}" for f in cells]
        assert not failures, "\n".join(failures)
    finally:
        for bucket in ("acme", "default"):
            assert srv.admin("PUT", f"/v1/admin/access/{bucket}", {"public_read": False})[0] == 200


def test_hidden_group_creation_looks_like_a_missing_bucket(
    setup: tuple[AuthServer, dict[str, dict[str, str]]],
) -> None:
    srv, creds = setup
    body = json.dumps({"bucket": "acme", "pattern": "data/*"}).encode()
    status, _, hidden = request("PUT", srv.url + "/v1/groups/g-new", {**creds["other-bucket"], **TEXT}, body)
    ghost = json.dumps({"bucket": "ghost-bucket", "pattern": "data/*"}).encode()
    g_status, _, missing = request("PUT", srv.url + "/v1/groups/g-new", {**OPERATOR, **TEXT}, ghost)
    assert status == g_status == 404
    assert json.loads(hidden)["error"]["code"] == json.loads(missing)["error"]["code"] == "BUCKET_NOT_FOUND"
    assert json.loads(hidden)["error"]["message"] == "bucket 'acme' does not exist"


def test_hidden_bucket_creation(setup: tuple[AuthServer, dict[str, dict[str, str]]]) -> None:
    """Creating a bucket one has no grant on: the same 404 whether it exists or not."""
    srv, creds = setup
    a = request("PUT", srv.url + "/v1/buckets/acme", creds["other-bucket"])
    b = request("PUT", srv.url + "/v1/buckets/never-made", creds["other-bucket"])
    assert a[0] == b[0] == 404
    assert a[2] == b[2].replace(b"never-made", b"acme")
    assert request("GET", srv.url + "/v1/buckets/never-made", OPERATOR)[0] == 404


def test_listings_show_only_what_the_caller_may_see(
    setup: tuple[AuthServer, dict[str, dict[str, str]]],
) -> None:
    srv, creds = setup
    _, _, body = request("GET", srv.url + "/v1/buckets", creds["read"])
    assert [b["name"] for b in json.loads(body)["buckets"]] == ["acme"]
    _, _, body = request("GET", srv.url + "/v1/buckets", creds["other-bucket"])
    assert [b["name"] for b in json.loads(body)["buckets"]] == ["other"]
    _, _, body = request("GET", srv.url + "/v1/groups", creds["other-bucket"])
    assert json.loads(body)["groups"] == []
    _, _, body = request("GET", srv.url + "/v1/groups", creds["read"])
    groups = json.loads(body)["groups"]
    assert "g-acme" in [g["group"] for g in groups] and {g["bucket"] for g in groups} == {"acme"}
    _, _, body = request("GET", srv.url + "/v1/buckets", OPERATOR)
    assert {"acme", "other", "default"} <= {b["name"] for b in json.loads(body)["buckets"]}


def test_wake_token_routes_keep_their_own_tokens(setup: tuple[AuthServer, dict[str, dict[str, str]]]) -> None:
    """Pull-wake ack/release and webhook callbacks carry the wake token, not a tenant credential."""
    srv, _ = setup
    default_admin = bearer(srv.token("default", "admin")["token"])
    request("POST", srv.url + "/v1/stream/jobs/a", {**OPERATOR, **TEXT}, b"more work")
    claimed: dict[str, Any] = {}
    for _ in range(100):
        status, _, body = request(
            "POST",
            srv.url + "/v1/stream/__ds/subscriptions/sub1/claim",
            {**default_admin, "Content-Type": "application/json"},
            b'{"worker": "w1"}',
        )
        if status == 200:
            claimed = json.loads(body)
            break
        time.sleep(0.05)
    assert claimed, "no wake to claim"
    ack = json.dumps(
        {"wake_id": claimed["wake_id"], "generation": claimed["generation"], "acks": [], "done": True}
    )
    status, _, body = request(
        "POST",
        srv.url + "/v1/stream/__ds/subscriptions/sub1/ack",
        {**bearer(claimed["token"]), "Content-Type": "application/json"},
        ack,
    )
    assert status == 200, body
    status, _, body = request(
        "POST",
        srv.url + "/v1/stream/__ds/subscriptions/sub1/ack",
        {**default_admin, "Content-Type": "application/json"},
        ack,
    )
    assert status == 401 and json.loads(body)["error"]["code"] == "TOKEN_INVALID"


def test_prefix_tokens(setup: tuple[AuthServer, dict[str, dict[str, str]]]) -> None:
    srv, _ = setup
    t = bearer(srv.token("acme", "write", prefix="data/p")["token"])
    assert request("PUT", srv.url + "/v1/buckets/acme/stream/data/p/one", {**t, **TEXT}, b"1")[0] == 201
    assert request("PUT", srv.url + "/v1/buckets/acme/stream/data/p", {**t, **TEXT}, b"1")[0] == 201
    status, _, body = request("PUT", srv.url + "/v1/buckets/acme/stream/data/pq", {**t, **TEXT}, b"1")
    assert status == 404 and json.loads(body)["error"]["code"] == "BUCKET_NOT_FOUND"
    assert request("GET", srv.url + S, t)[0] == 404  # outside its prefix: as if missing
    assert request("GET", srv.url + "/v1/groups/g-acme", t)[0] == 403  # bucket-wide needs no prefix
    assert request("GET", srv.url + "/v1/buckets/acme", t)[0] == 200


def test_public_read_buckets(setup: tuple[AuthServer, dict[str, dict[str, str]]]) -> None:
    srv, creds = setup
    srv.bucket("open-data")
    url = srv.url + "/v1/buckets/open-data/stream/x"
    assert request("PUT", url, {**OPERATOR, **TEXT}, b"public")[0] == 201
    assert request("GET", url + "?offset=-1")[0] == 401
    assert srv.admin("PUT", "/v1/admin/access/open-data", {"public_read": True}) == (
        200,
        {"bucket": "open-data", "public_read": True},
    )
    assert request("GET", url + "?offset=-1")[2] == b"public"
    assert request("GET", url + "?offset=-1", creds["other-bucket"])[0] == 200
    assert request("POST", url, TEXT, b"no")[0] == 401
    assert request("POST", url, {**creds["other-bucket"], **TEXT}, b"no")[0] == 404
    assert request("GET", url + "?offset=-1", creds["made-up"])[0] == 401  # a bad credential is still bad
    assert srv.admin("PUT", "/v1/admin/access/open-data", {"public_read": False})[0] == 200
    assert request("GET", url + "?offset=-1")[0] == 401


def test_tokens_mode_refuses_jwts(tmp_path: Path) -> None:
    srv = AuthServer(tmp_path / "data", mode="tokens").start()
    try:
        srv.bucket("acme")
        url = srv.url + "/v1/buckets/acme/stream/x"
        assert request("PUT", url, {**bearer(srv.jwt("tiered:acme:admin")), **TEXT})[0] == 401
        assert request("PUT", url, {**bearer(srv.token("acme", "write")["token"]), **TEXT})[0] == 201
        assert request("PUT", url, {**OPERATOR, **TEXT})[0] == 200  # the operator may do anything
    finally:
        srv.stop()
