"""Any spelling of a request gets its canonical spelling's decision, over HTTP, on both adapters.

The HTTP twin of the property in ``tests/api/test_http_target.py``: a server per
adapter (``--auth jwt``) holds buckets ``acme``, ``other`` and the public-read
``pub``, streams whose names need decoding (``data/pct%41``: text that looks
like an escape, UTF-8, spaces), groups and a subscription. Hypothesis draws a
request of every route family, a caller, and another spelling of the request
(``tests/support/encodings.py``: any character of names, literal segments, query names
and values and of the ``Stream-Forked-From`` path percent-encoded, hex in
either case, double encoding). Then:

* a read (``GET``/``HEAD``: catch-up, long-poll, SSE, descriptions): the
  spelling and the canonical form get the same status and body, and are
  counted alike in the bucket's usage (a live read as ``live``);
* a request the caller may not make: the same status and body, and the world
  (buckets, groups with their members and cursors, the subscription, tokens,
  usage) is what it was;
* a write the caller may make, on a fresh name: the spelling acts on the very
  resource the canonical form then finds (created then re-confirmed, appended
  twice, deleted then missing).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from http.client import HTTPConnection
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.support.auth_support import OPERATOR, AuthServer, bearer
from tests.support.deadlines import wait_for
from tests.support.encodings import Part, Shape, Spelling, canonical, lit, spelled
from tests.support.http_helpers import request as http

pytestmark = pytest.mark.timeout(600)
TEXT = {"Content-Type": "text/plain"}
_n = itertools.count()
PROPERTY = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)

#: (bucket, stream path, content)
STREAMS = (
    ("acme", "data/s", b"hello"),
    ("acme", "data/pct%41", b"looks like an escape"),
    ("acme", "data/\u00e9/a b+c", b"unicode"),
    ("other", "o/s", b"theirs"),
    ("pub", "p/a", b"public"),
)
GROUPS = {"g-acme": ("acme", "data/*"), "g.pub": ("pub", "p/*")}
CREDENTIALS = ("none", "read", "write", "admin", "other", "pub-read", "jwt", "operator")


@pytest.fixture(scope="module", params=["granian", "aiohttp"])
def setup(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    srv = AuthServer(
        tmp_path_factory.mktemp(f"encodings-{request.param}") / "data",
        "--http-server",
        request.param,
        "--long-poll-timeout-s",
        "1",
        "--sse-max-connection-s",
        "2",
    ).start()
    try:
        for bucket in ("acme", "other", "pub"):
            srv.bucket(bucket)
        assert srv.admin("PUT", "/v1/admin/access/pub", {"public_read": True})[0] == 200
        for bucket, path, body in STREAMS:
            status, _, resp = http(
                "PUT", url(srv, canonical_stream(bucket, path)), {**OPERATOR, **TEXT}, body
            )
            assert status == 201, resp
        for stream, ctype in (("wakes", "application/json"), ("jobs/a", "text/plain")):
            assert http("PUT", f"{srv.url}/v1/stream/{stream}", {**OPERATOR, "Content-Type": ctype})[0] == 201
        for name, (bucket, pattern) in GROUPS.items():
            assert srv.admin("PUT", f"/v1/groups/{name}", {"bucket": bucket, "pattern": pattern})[0] == 201
        # A group is created without a plan; the sweeper makes its first one within 0.5 s. Wait for it,
        # so that it never lands between an example's two looks at the world.
        for name in GROUPS:
            wait_for(lambda g=name: planned(srv, g), 10, f"the sweeper's first plan of group {name!r}")
        sub = {"type": "pull-wake", "pattern": "jobs/*", "wake_stream": "wakes"}
        assert srv.admin("PUT", "/v1/stream/__ds/subscriptions/sub1", sub)[0] == 201
        creds: dict[str, dict[str, str]] = {"none": {}, "operator": OPERATOR}
        for scope in ("read", "write", "admin"):
            creds[scope] = bearer(srv.token("acme", scope)["token"])
        creds["other"] = bearer(srv.token("other", "admin")["token"])
        creds["pub-read"] = bearer(srv.token("pub", "read")["token"])
        creds["jwt"] = bearer(srv.jwt("tiered:acme:write tiered:other:read"))
        yield srv, creds
    finally:
        srv.stop()


def planned(srv: AuthServer, group: str) -> bool:
    status, body = srv.admin("GET", f"/v1/groups/{group}")
    assert status == 200, body
    return int(body["revision"]) >= 1


def url(srv: AuthServer, spelling: Spelling) -> str:
    return srv.url + spelling.target


def stream_parts(bucket: str, path: str) -> tuple[Part, ...]:
    return (*lit("v1", "buckets"), Part(bucket), Part("stream"), Part(path, slashes=True))


def canonical_stream(bucket: str, path: str) -> Spelling:
    return canonical(Shape("GET", stream_parts(bucket, path)))


def send(
    srv: AuthServer, shape: Shape, spelling: Spelling, auth: dict[str, str], body: bytes = b""
) -> tuple[int, bytes]:
    headers = {**spelling.headers, **auth}
    if dict(shape.query).get("live") == "sse":  # the status, then hang up (the body would stream on)
        conn = HTTPConnection("127.0.0.1", srv.port, timeout=15)
        try:
            conn.request(shape.method, spelling.target, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read() if resp.status != 200 else b""
        finally:
            conn.close()
    status, _, data = http(shape.method, url(srv, spelling), headers, body)
    return status, data


def usage(srv: AuthServer) -> dict[str, Any]:
    status, body = srv.admin("GET", "/v1/admin/usage")
    assert status == 200, body
    return {row["bucket"]: row["requests"] for row in body["buckets"]}


def delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, int]]:
    return {
        b: {
            k: v - before.get(b, {}).get(k, 0)
            for k, v in after[b].items()
            if v != before.get(b, {}).get(k, 0)
        }
        for b in after
        if after[b] != before.get(b)
    }


def world(srv: AuthServer) -> Any:
    """What a refusal must not change. Usage without its ``admin`` counts: describing groups adds to them."""
    out: list[Any] = []
    for path in ("/v1/buckets", "/v1/admin/tokens", "/v1/admin/usage"):
        status, body = srv.admin("GET", path)
        assert status == 200, body
        if path == "/v1/admin/usage":
            for row in body["buckets"]:
                row["retained_bytes"] = sum(row["retained_bytes"].values())
                row["requests"].pop("admin")
        out.append(body)
    for path in (*(f"/v1/groups/{g}" for g in GROUPS), "/v1/stream/__ds/subscriptions/sub1"):
        out.append(srv.admin("GET", path))
    return out


# ----------------------------------------------------------------- shapes


def _stream(draw: st.DrawFn) -> tuple[str, str]:
    bucket, path, _ = draw(st.sampled_from(STREAMS))
    return bucket, path


@st.composite
def reads(draw: st.DrawFn) -> Shape:
    kind = draw(st.sampled_from(["catch-up", "long-poll", "sse", "head", "bucket", "group", "subscription"]))
    bucket, path = _stream(draw)
    if kind == "bucket":
        return Shape(
            "GET",
            (*lit("v1", "buckets"), Part(draw(st.sampled_from(["acme", "other", "pub", "ghost-bucket"])))),
        )
    if kind == "group":
        return Shape("GET", (*lit("v1", "groups"), Part(draw(st.sampled_from([*GROUPS, "ghost"])))))
    if kind == "subscription":
        return Shape("GET", lit("v1", "stream", "__ds", "subscriptions", "sub1"))
    if kind == "head":
        return Shape("HEAD", stream_parts(bucket, path))
    query: tuple[tuple[str, str], ...] = (("offset", "-1"),)
    if kind != "catch-up":
        query = (*query, ("live", kind))
    return Shape("GET", stream_parts(bucket, path), query)


@st.composite
def writes(draw: st.DrawFn) -> tuple[Shape, bytes]:
    """A request that changes state (the caller may or may not make it)."""
    kind = draw(
        st.sampled_from(
            ["append", "create", "delete", "fork", "bucket", "join", "heartbeat", "leave", "claim", "quotas"]
        )
    )
    bucket, path = _stream(draw)
    if kind == "append":
        return Shape("POST", stream_parts(bucket, path), headers=(("Content-Type", "text/plain"),)), b"more"
    if kind in ("create", "delete"):
        return Shape("PUT" if kind == "create" else "DELETE", stream_parts(bucket, path + "/x")), b""
    if kind == "fork":
        target = stream_parts(draw(st.sampled_from(["acme", "other"])), "forks/f")
        return Shape("PUT", target, fork=stream_parts(bucket, path)), b""
    if kind == "bucket":
        return Shape("PUT", (*lit("v1", "buckets"), Part(bucket))), b""
    if kind == "claim":
        return Shape(
            "POST", lit("v1", "stream", "__ds", "subscriptions", "sub1", "claim")
        ), b'{"worker": "w"}'
    if kind == "quotas":
        return Shape("PUT", (*lit("v1", "admin", "quotas"), Part(bucket))), b'{"max_streams": 0}'
    group = draw(st.sampled_from(list(GROUPS)))
    body = (
        {"member": "m", "join_id": "j"}
        if kind == "join"
        else {"member": "m", "incarnation": 1, "generation": 1}
    )
    return Shape("POST", (*lit("v1", "groups"), Part(group), Part(kind))), json.dumps(body).encode()


def allowed(cred: str, shape: Shape) -> bool:
    """Whether a refused-side credential may make the write ``shape`` after all (those examples are skipped)."""
    texts = [p.text for p in shape.parts]
    if texts[1] == "groups":
        member_of = {"acme": "read", "pub": "pub-read"}[GROUPS[texts[2]][0]]
        return cred == member_of  # a consumer's read scope may join, heartbeat and leave
    return cred == "other" and texts[1] == "buckets" and texts[2] == "other"  # admin on other


# ----------------------------------------------------------------- the properties


@PROPERTY
@given(data=st.data())
def test_reads_get_the_canonical_decision(setup: Any, data: st.DataObject) -> None:
    srv, creds = setup
    shape = data.draw(reads(), label="shape")
    cred = data.draw(st.sampled_from(CREDENTIALS), label="credential")
    other = data.draw(spelled(shape), label="spelling")
    plain = canonical(shape)
    u0 = usage(srv)
    got = send(srv, shape, other, creds[cred])
    u1 = usage(srv)
    want = send(srv, shape, plain, creds[cred])
    u2 = usage(srv)
    assert got == want, f"{shape.describe()} as {cred}: {other.target!r}"
    assert delta(u0, u1) == delta(u1, u2), f"{shape.describe()} as {cred}: counted differently"


@PROPERTY
@given(data=st.data())
def test_refused_writes_get_the_canonical_refusal_and_change_nothing(setup: Any, data: st.DataObject) -> None:
    srv, creds = setup
    shape, body = data.draw(writes(), label="shape")
    cred = data.draw(st.sampled_from(["none", "read", "other", "pub-read"]), label="credential")
    assume(not allowed(cred, shape))
    other = data.draw(spelled(shape), label="spelling")
    plain = canonical(shape)
    before = world(srv)
    got = send(srv, shape, other, creds[cred], body)
    assert got[0] in (401, 403, 404), f"{shape.describe()} as {cred}: {other.target!r} -> {got}"
    assert world(srv) == before, (
        f"{shape.describe()} as {cred}: {other.target!r} refused ({got[0]}) but changed something"
    )
    want = send(srv, shape, plain, creds[cred], body)
    assert got == want, f"{shape.describe()} as {cred}: {other.target!r}"


def _fresh(shape: Shape) -> Shape:
    """``shape`` on a fresh stream name (its last part), so each example starts from nothing."""
    last = shape.parts[-1]
    return Shape(
        shape.method,
        (*shape.parts[:-1], Part(f"{last.text}/n{next(_n):06d} \u00e9%41", slashes=True)),
        shape.query,
        shape.fork,
        shape.headers,
    )


@PROPERTY
@given(data=st.data())
def test_allowed_writes_act_on_the_resource_the_canonical_spelling_names(
    setup: Any, data: st.DataObject
) -> None:
    srv, creds = setup
    kind = data.draw(st.sampled_from(["create", "append", "delete", "fork"]), label="kind")
    write = creds["jwt"]  # write on acme, read on other
    if kind == "fork":
        shape = _fresh(Shape("PUT", stream_parts("acme", "forks"), fork=stream_parts("other", "o/s")))
    else:
        path = data.draw(st.sampled_from(STREAMS))[1]
        shape = _fresh(Shape("PUT", stream_parts("acme", path), headers=(("Content-Type", "text/plain"),)))
    read = Shape("GET", shape.parts, (("offset", "-1"),))
    if kind == "create" or kind == "fork":
        first = send(srv, shape, data.draw(spelled(shape), label="spelling"), write)
        assert first[0] == 201, (shape.describe(), first)
        again = send(srv, shape, canonical(shape), write)
        assert again[0] == 200, (shape.describe(), again)  # the very stream just made, re-confirmed
        assert send(srv, read, canonical(read), write)[1] == (b"theirs" if kind == "fork" else b"")
        return
    assert send(srv, shape, canonical(shape), write, b"first")[0] == 201
    if kind == "append":
        appending = Shape("POST", shape.parts, headers=(("Content-Type", "text/plain"),))
        assert (
            send(srv, appending, data.draw(spelled(appending), label="spelling"), write, b"+second")[0] == 204
        )
        assert send(srv, read, canonical(read), write)[1] == b"first+second"
    else:
        deleting = Shape("DELETE", shape.parts)
        assert send(srv, deleting, data.draw(spelled(deleting), label="spelling"), write)[0] == 204
        assert send(srv, deleting, canonical(deleting), write)[0] == 404
