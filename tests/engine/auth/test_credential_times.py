"""Credentials whose times are beyond any calendar: refused as invalid, never a 500 on a live read.

On both HTTP adapters, ``tiered serve --auth jwt``:

* a JWT whose ``exp`` is 10^400 (a valid JSON number, and in the future) is a
  401 on a catch-up read, a long-poll and an SSE read (it was accepted, and
  the live reads failed: a long-poll answered 500 with ``OverflowError`` in
  the lease, an SSE stream was cut); likewise ``nbf`` or ``iat`` of 10^400;
* a JWT expiring at the end of year 9999 still works, live reads included;
* a tiered token cannot be issued or rotated with a ``ttl_s``,
  ``expires_ms`` or ``grace_s`` that ends after year 9999 (400; it was 201,
  with an expiry no JSON client reads exactly).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.support.auth_support import OPERATOR, AuthServer, bearer
from tests.support.http_helpers import request as http
from tiered.engine.auth.credentials import MAX_TIME_S

pytestmark = pytest.mark.timeout(120)
TEXT = {"Content-Type": "text/plain"}


@pytest.fixture(scope="module", params=["granian", "aiohttp"])
def srv(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthServer]:
    s = AuthServer(
        tmp_path_factory.mktemp(f"times-{request.param}") / "data",
        "--http-server",
        request.param,
        "--long-poll-timeout-s",
        "1",
    ).start()
    try:
        s.bucket("acme")
        status, _, body = http("PUT", f"{s.url}/v1/buckets/acme/stream/s", {**OPERATOR, **TEXT}, b"hello")
        assert status == 201, body
        yield s
    finally:
        s.stop()


def reads(srv: AuthServer, token: str) -> list[int]:
    """Statuses of a catch-up read, a long-poll at the tail and an SSE read with ``token``."""
    url = f"{srv.url}/v1/buckets/acme/stream/s"
    auth = bearer(token)
    catch_up, headers, _ = http("GET", url + "?offset=-1", auth)
    tail = headers.get("Stream-Next-Offset", "-1")
    poll = http("GET", url + f"?offset={tail}&live=long-poll", auth)[0]
    if catch_up != 401:
        return [catch_up, poll]  # accepted: an SSE read would stay open (and be cut), not answer
    return [catch_up, poll, http("GET", url + f"?offset={tail}&live=sse", auth, timeout=5)[0]]


@pytest.mark.parametrize("claim", ["exp", "nbf", "iat"])
def test_a_jwt_time_beyond_year_9999_is_an_invalid_token(srv: AuthServer, claim: str) -> None:
    token = srv.jwt("tiered:acme:read", **{claim: 10**400})
    assert reads(srv, token) == [401, 401, 401]
    status, headers, body = http("GET", f"{srv.url}/v1/buckets/acme/stream/s?offset=-1", bearer(token))
    assert json.loads(body)["error"]["code"] == "UNAUTHORIZED" and headers["WWW-Authenticate"]
    assert "OverflowError" not in srv.log() and "Traceback" not in srv.log()


def test_a_jwt_expiring_at_the_end_of_9999_still_reads_live(srv: AuthServer) -> None:
    token = srv.jwt("tiered:acme:read", exp=MAX_TIME_S)
    url = f"{srv.url}/v1/buckets/acme/stream/s"
    status, headers, body = http("GET", url + "?offset=-1", bearer(token))
    assert (status, body) == (200, b"hello")
    tail = headers["Stream-Next-Offset"]
    assert http("GET", url + f"?offset={tail}&live=long-poll", bearer(token))[0] == 204  # timed out
    assert "Traceback" not in srv.log()


@pytest.mark.parametrize(
    "body",
    [{"ttl_s": 2**53 - 1}, {"expires_ms": 2**53 - 1}, {"ttl_s": (MAX_TIME_S * 1000) // 1000}],
    ids=["ttl_s-max-safe-integer", "expires_ms-max-safe-integer", "ttl_s-past-9999"],
)
def test_a_token_cannot_outlive_year_9999(srv: AuthServer, body: dict[str, int]) -> None:
    before = srv.admin("GET", "/v1/admin/tokens?bucket=acme")[1]["tokens"]
    status, answer = srv.admin("POST", "/v1/admin/tokens", {"bucket": "acme", "scope": "read", **body})
    assert status == 400, answer
    assert answer["error"]["code"] == "BAD_REQUEST" and "9999" in answer["error"]["message"]
    assert srv.admin("GET", "/v1/admin/tokens?bucket=acme")[1]["tokens"] == before  # nothing issued


def test_a_rotation_grace_cannot_outlive_year_9999(srv: AuthServer) -> None:
    token = srv.token("acme", "read")
    status, answer = srv.admin("POST", f"/v1/admin/tokens/{token['id']}/rotate", {"grace_s": 2**53 - 1})
    assert status == 400, answer
    assert "9999" in answer["error"]["message"]
    listed = srv.admin("GET", "/v1/admin/tokens?bucket=acme")[1]["tokens"]
    assert [t["id"] for t in listed if t.get("replaces") == token["id"]] == []  # nothing rotated
    assert http("GET", f"{srv.url}/v1/buckets/acme/stream/s?offset=-1", bearer(token["token"]))[0] == 200
