"""One parse of a request (``tiered.api.kit.target``): what it yields, what it refuses, and that no spelling changes a decision.

The property: for every route family, any spelling of a request (percent-encoding
of any character of its names, literal segments, query names and values and of
the ``Stream-Forked-From`` path; hex digits in either case; double encoding)
parses to the same target, gets the same shard key, and gets the same access
decision (status, error code, the access the route sees, a live lease or not)
for every kind of caller as its canonical spelling, through the real auth
middleware and error mapper. The HTTP twin over both adapters is
``tests/engine/auth/test_auth_encodings.py``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.encodings import Part, Shape, Spelling, canonical, lit, spelled, stream_paths
from tiered.api.access import Access, AccessMap
from tiered.api.kit.errors import map_errors
from tiered.api.kit.middleware.auth import auth_middleware
from tiered.api.kit.target import Family, Target
from tiered.api.kit.types import Request, Response
from tiered.cluster.gateway.routing import shard_key
from tiered.cluster.gateway.subrequest import internal_request
from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.auth.credentials import OPERATOR, Grant, Level, Principal

# ----------------------------------------------------------------- what a parse yields


def parse(method: str, target: str, headers: dict[str, str] | None = None) -> Target:
    path, _, query = target.partition("?")
    return internal_request(method, path, headers or {}, query=query).target


def refused(method: str, target: str, headers: dict[str, str] | None = None) -> tuple[ErrorCode, str]:
    with pytest.raises(TieredError) as exc:
        parse(method, target, headers)
    return exc.value.code, exc.value.message


def test_stream_targets() -> None:
    t = parse("GET", "/v1/buckets/a%63me/stream/data%2Fpct%2541?offset=-1&li%76e=sse")
    assert (t.family, t.bucket, t.stream, t.live) == (Family.STREAM, "acme", "data/pct%41", "sse")
    assert t.query == {"offset": "-1", "live": "sse"}
    assert parse("HEAD", "/v1/stream/x?live=whatever").live is None  # HEAD is never a live read
    t = parse("PUT", "/v1/stream/f", {"Stream-Forked-From": "/v1/buckets/b%62b/stream/pct%2500?offset=1"})
    assert (t.bucket, t.stream, t.fork) == ("default", "f", ("bbb", "pct%00"))
    assert parse("POST", "/v1/stream/f", {"Stream-Forked-From": "garbage"}).fork is None  # only a PUT forks


def test_other_families() -> None:
    assert parse("GET", "/v1/stream/__ds/jwks.json").family is Family.JWKS
    t = parse("POST", "/v1/stream/%5F%5Fds/subscriptions/s%3A1/cl%61im")
    assert (t.family, t.name, t.action, t.rest) == (Family.SUBSCRIPTION, "s:1", "claim", ())
    t = parse("DELETE", "/v1/stream/__ds/subscriptions/s1/streams/a%2Fb/c")
    assert (t.action, t.rest) == ("streams", ("a%2Fb", "c"))
    assert parse("POST", "/v1/stream/__ds/_cluster/feed").family is Family.CONTROL
    t = parse("POST", "/v1/groups/g-%61cme/join")
    assert (t.family, t.name, t.action) == (Family.GROUP, "g-acme", "join")
    assert parse("GET", "/v1/buckets/%61cme").bucket == "acme"
    t = parse("PUT", "/v1/admin/retention/acme/a%2Fb")
    assert (t.family, t.bucket, t.stream) == (Family.ADMIN, "acme", "a/b")
    for path, family in (
        ("/v1/buckets", Family.BUCKETS),
        ("/v1/groups", Family.GROUPS),
        ("/metrics", Family.METRICS),
        ("/healthz", Family.OTHER),
        ("/v1/buckets/acme/nothing", Family.OTHER),
        ("/v1/groups/", Family.OTHER),
    ):
        assert parse("GET", path).family is family, path


@pytest.mark.parametrize(
    ("method", "target", "headers", "code"),
    [
        ("GET", "/v1/stream/pct%%30%30", {}, ErrorCode.BAD_REQUEST),  # a stray '%': never decoded twice
        ("GET", "/v1/stream/a%zz", {}, ErrorCode.BAD_REQUEST),
        ("GET", "/v1/stream/a%", {}, ErrorCode.BAD_REQUEST),
        ("GET", "/v1/stream/%ff", {}, ErrorCode.BAD_REQUEST),  # not UTF-8
        ("GET", "/v1/stream/a?x=%ff", {}, ErrorCode.BAD_REQUEST),
        ("GET", "/v1/stream/a%2F%2E%2E%2Fb", {}, ErrorCode.BAD_REQUEST),
        ("GET", "/v1/stream/a?offset=-1&live=SSE", {}, ErrorCode.BAD_REQUEST),  # an unknown live mode
        ("GET", "/v1/stream/__ds%2Fx", {}, ErrorCode.BAD_REQUEST),  # reserved
        ("GET", "/v1/buckets/Acme/stream/a", {}, ErrorCode.BAD_REQUEST),
        ("GET", "/v1/buckets/Acme", {}, ErrorCode.BAD_REQUEST),
        ("POST", "/v1/groups/g%2Fx/join", {}, ErrorCode.BAD_REQUEST),
        ("GET", "/v1/stream/__ds/subscriptions/%ff", {}, ErrorCode.INVALID_REQUEST),
        (
            "PUT",
            "/v1/stream/f",
            {"Stream-Forked-From": "/v1/stream/pct%%30%30"},
            ErrorCode.FORK_SOURCE_NOT_FOUND,
        ),
        ("PUT", "/v1/stream/f", {"Stream-Forked-From": "/v1/stream/a%00"}, ErrorCode.FORK_SOURCE_NOT_FOUND),
        (
            "PUT",
            "/v1/stream/f",
            {"Stream-Forked-From": "https://elsewhere/v1/stream/a"},
            ErrorCode.FORK_SOURCE_NOT_FOUND,
        ),
        ("PUT", "/v1/stream/f", {"Stream-Forked-From": "/v1/stream/\x01"}, ErrorCode.BAD_REQUEST),
    ],
)
def test_what_does_not_parse_is_refused(
    method: str, target: str, headers: dict[str, str], code: ErrorCode
) -> None:
    assert refused(method, target, headers)[0] is code


def test_a_request_is_parsed_once_and_its_query_is_the_routes_query() -> None:
    request = internal_request("GET", "/v1/stream/x", {}, query="offset=-1&li%76e=sse")
    assert request.target is request.target
    assert request.target.query is request.query


# ----------------------------------------------------------------- the property


PUBLIC = frozenset({"pub"})
GROUPS = {"g-acme": "acme", "g.pub": "pub"}
BUCKETS = ("acme", "other", "pub", "default", "ghost-bucket", "Bad_Name")
PRINCIPALS: dict[str, Principal | None] = {
    "none": None,
    "operator": OPERATOR,
    "read-acme": Principal("t1", "token", (Grant("acme", Level.READ),)),
    "write-acme": Principal("t2", "token", (Grant("acme", Level.WRITE),)),
    "admin-acme": Principal("t3", "token", (Grant("acme", Level.ADMIN),)),
    "prefix-acme": Principal("t4", "token", (Grant("acme", Level.WRITE, "data"),)),
    "write-acme-read-other": Principal(
        "t5", "token", (Grant("acme", Level.WRITE), Grant("other", Level.READ))
    ),
    "read-default": Principal("t6", "token", (Grant("default", Level.READ),)),
    "admin-other": Principal("t7", "token", (Grant("other", Level.ADMIN),)),
}


class _Leases:
    def close(self, lease: object) -> None:
        pass


class _Auth:
    """``AuthService`` as the middleware uses it: bearer names a principal of ``PRINCIPALS``."""

    enabled = True
    leases = _Leases()

    def authenticate(self, header: str | None) -> Principal | None:
        return None if header is None else PRINCIPALS[header.removeprefix("Bearer ")]

    def public_read(self, bucket: str) -> bool:
        return bucket in PUBLIC

    def lease(self, principal: Principal) -> object:
        return object()


def _seen(request: Request) -> tuple[Any, ...]:
    t = request.target
    a = request.access
    assert isinstance(a, Access)
    missing = a.missing().code if a.missing is not None else None
    access = (
        a.kind,
        a.bucket,
        a.level,
        a.stream,
        a.whole_bucket,
        a.request_class,
        a.live,
        a.fork,
        a.public,
        missing,
    )
    rest = unquote("/".join(t.rest), errors="strict")
    target = (
        t.family,
        t.bucket,
        t.stream,
        t.name,
        t.action,
        rest,
        t.live,
        t.fork,
        dict(t.query),
        shard_key(t),
    )
    leased = request.auth is not None and request.auth.lease is not None
    return target, access, leased


@pytest.fixture(scope="module")
def decide() -> Iterator[Any]:
    loop = asyncio.new_event_loop()
    seen: list[tuple[Any, ...]] = []

    async def route(request: Request) -> Response:
        seen.append(_seen(request))
        return Response(200)

    handler = map_errors(auth_middleware(_Auth(), AccessMap(GROUPS.get))(route))  # type: ignore[arg-type]

    def run(shape: Shape, spelling: Spelling, who: str) -> tuple[Any, ...]:
        headers = dict(spelling.headers)
        if who != "none":
            headers["Authorization"] = f"Bearer {who}"
        request = internal_request(shape.method, spelling.path, headers, b"{}", query=spelling.query)
        seen.clear()
        response = loop.run_until_complete(handler(request))
        code = json.loads(response.body)["error"]["code"] if response.status >= 400 else None  # type: ignore[arg-type]
        return response.status, code, seen[0] if seen else None

    yield run
    loop.close()


def _query(draw: st.DrawFn, method: str) -> tuple[tuple[str, str], ...]:
    if method != "GET":
        return ()
    return draw(
        st.sampled_from(
            [
                (("offset", "-1"),),
                (("offset", "-1"), ("live", "long-poll")),
                (("offset", "now"), ("live", "sse")),
                (("live", "sse"), ("offset", "0000000000000000_0000000000000000"), ("cursor", "a b+c")),
                (("offset", "-1"), ("live", "bogus")),
                (("offset", "-1"), ("li ve", "sse")),
                (("live", "long-poll"), ("live", "sse")),  # the first wins, for every layer
            ]
        )
    )


@st.composite
def shapes(draw: st.DrawFn) -> Shape:
    """A request of any route family, decoded."""
    family = draw(st.sampled_from(["stream", "bucket", "group", "subscription", "admin", "node"]))
    bucket = draw(st.sampled_from(BUCKETS))
    if family == "stream":
        method = draw(st.sampled_from(["GET", "HEAD", "PUT", "POST", "DELETE", "PATCH"]))
        path = Part(draw(stream_paths()), slashes=True)
        default = draw(st.booleans())
        parts = (
            lit("v1", "stream") + (path,)
            if default
            else (*lit("v1", "buckets"), Part(bucket), Part("stream"), path)
        )
        fork = None
        if method == "PUT" and draw(st.booleans()):
            source = Part(draw(stream_paths()), slashes=True)
            fork = (*lit("v1", "buckets"), Part(draw(st.sampled_from(BUCKETS))), Part("stream"), source)
        return Shape(method, parts, _query(draw, method), fork)
    if family == "bucket":
        return Shape(
            draw(st.sampled_from(["GET", "HEAD", "PUT", "DELETE"])), (*lit("v1", "buckets"), Part(bucket))
        )
    if family == "group":
        name = Part(draw(st.sampled_from([*GROUPS, "ghost"])))
        method, action = draw(
            st.sampled_from(
                [
                    ("GET", ()),
                    ("PUT", ()),
                    ("DELETE", ()),
                    ("POST", ("join",)),
                    ("POST", ("heartbeat",)),
                    ("POST", ("leave",)),
                    ("POST", ("streams",)),
                    ("DELETE", ("streams", "data/a b")),
                    ("POST", ("bogus",)),
                ]
            )
        )
        tail = tuple(Part(a, slashes=True) for a in action)
        return Shape(method, (*lit("v1", "groups"), name, *tail))
    if family == "subscription":
        sub = Part(draw(st.sampled_from(["sub1", "s:1", "é", "ghost-sub"])))
        method, action = draw(
            st.sampled_from(
                [
                    ("GET", ()),
                    ("PUT", ()),
                    ("DELETE", ()),
                    ("POST", ("claim",)),
                    ("POST", ("ack",)),
                    ("POST", ("callback",)),
                    ("POST", ("release",)),
                    ("POST", ("streams",)),
                    ("DELETE", ("streams", "jobs/a b")),
                ]
            )
        )
        tail = tuple(Part(a, slashes=True) for a in action)
        parts = (*lit("v1", "stream", "__ds", "subscriptions"), sub, *tail)
        if draw(st.integers(0, 9)) == 0:
            parts = lit("v1", "stream", "__ds", "jwks.json")
        return Shape(method, parts)
    if family == "admin":
        section = draw(st.sampled_from(["quotas", "access", "retention", "retain", "tokens"]))
        parts = (*lit("v1", "admin", section), Part(bucket))
        if section in ("retention", "retain"):
            parts = (*parts, Part(draw(stream_paths()), slashes=True))
        return Shape(draw(st.sampled_from(["GET", "PUT", "POST"])), parts)
    return Shape(
        "GET", lit(*draw(st.sampled_from([("v1", "buckets"), ("v1", "groups"), ("metrics",), ("healthz",)])))
    )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=shapes(), data=st.data())
def test_every_spelling_of_a_request_gets_the_canonical_decision(
    decide: Any, shape: Shape, data: st.DataObject
) -> None:
    plain = canonical(shape)
    other = data.draw(spelled(shape), label="spelling")
    for who in PRINCIPALS:
        want = decide(shape, plain, who)
        got = decide(shape, other, who)
        assert got == want, (
            f"{shape.describe()} as {who}: {other.target!r} -> {got}, {plain.target!r} -> {want}"
        )
