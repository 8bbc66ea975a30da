"""Live reads end with their credential, on both HTTP adapters.

* SSE: when the token (or JWT) expires, the stream ends with a last control
  event ``{"streamNextOffset": ..., "credentialExpired": true}``; reconnecting
  with it is a 401.
* Long-poll: a wait ends when the credential expires (as a timeout would);
  the next request is a 401.
* Revoking a token ends its SSE and long-poll reads within a second (they
  are woken, not left to their 15 s keep-alive or 20 s long-poll timeout);
  a rotation's grace period keeps the old token's reads until it ends.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from tests.support.auth_support import OPERATOR, AuthServer, bearer
from tests.support.http_helpers import Background, SseReader, request

pytestmark = pytest.mark.timeout(180)
TEXT = {"Content-Type": "text/plain"}


@pytest.fixture(scope="module", params=["granian", "aiohttp"])
def srv(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthServer]:
    s = AuthServer(
        tmp_path_factory.mktemp(f"live-{request.param}") / "data",
        "--http-server",
        request.param,
        "--long-poll-timeout-s",
        "20",
        "--sse-max-connection-s",
        "60",
    ).start()
    try:
        s.bucket("acme")
        yield s
    finally:
        s.stop()


def stream(srv: AuthServer, name: str, body: bytes = b"hello") -> str:
    url = f"{srv.url}/v1/buckets/acme/stream/{name}"
    status, _, resp = request("PUT", url, {**OPERATOR, **TEXT}, body)
    assert status == 201, resp
    return url


def wait_until_expired(expires_ms: int) -> None:
    time.sleep(max(0.0, expires_ms / 1000 - time.time()) + 0.05)


def test_sse_ends_with_a_control_event_when_the_token_expires(srv: AuthServer) -> None:
    url = stream(srv, "sse-expiry")
    token = srv.token("acme", "read", ttl_s=2)
    auth = bearer(token["token"])
    with SseReader(url, "-1", timeout=15, headers=auth) as sse:
        assert sse.status == 200
        sse.read_until(lambda ev: any(e.event == "data" for e in ev))
        assert request("POST", url, {**OPERATOR, **TEXT}, b" world")[0] == 204
        sse.read_until(lambda ev: "".join(e.data for e in ev if e.event == "data") == "hello world")
        events = sse.read_to_eof(timeout=15)
    last = events[-1]
    assert last.event == "control"
    control = last.json()
    assert control["credentialExpired"] is True
    assert control["streamNextOffset"] == "0000000000000000_0000000000000011"
    assert time.time() * 1000 >= token["expires_ms"]
    status, headers, body = request("GET", url + "?offset=-1&live=sse", auth)
    assert status == 401 and json.loads(body)["error"]["message"] == "the credential has expired"
    assert headers["WWW-Authenticate"].startswith("Bearer")


def test_sse_ends_when_the_jwt_expires(srv: AuthServer) -> None:
    url = stream(srv, "sse-jwt")
    exp = int(time.time()) + 2
    auth = bearer(srv.jwt("tiered:acme:read", exp=exp))
    with SseReader(url, "-1", timeout=15, headers=auth) as sse:
        assert sse.status == 200
        events = sse.read_to_eof(timeout=15)
    assert events[-1].json()["credentialExpired"] is True
    assert time.time() >= exp
    assert request("GET", url + "?offset=-1", auth)[0] == 401


def test_long_poll_ends_at_expiry_and_the_next_request_is_401(srv: AuthServer) -> None:
    url = stream(srv, "lp-expiry")
    token = srv.token("acme", "read", ttl_s=2)
    auth = bearer(token["token"])
    started = time.monotonic()
    status, headers, _ = request("GET", url + "?offset=now&live=long-poll", auth, timeout=30)
    # Answered like a timeout, long before the 20 s long-poll timeout.
    assert status == 204 and headers["Stream-Up-To-Date"] == "true"
    assert time.monotonic() - started < 15
    assert time.time() * 1000 >= token["expires_ms"]
    assert request("GET", url + "?offset=now&live=long-poll", auth)[0] == 401


def test_revoking_a_token_ends_its_live_reads_within_a_second(srv: AuthServer) -> None:
    url = stream(srv, "revoke")
    token = srv.token("acme", "read")
    other = srv.token("acme", "read")
    auth = bearer(token["token"])
    sse = SseReader(url, "-1", timeout=30, headers=auth)
    survivor = SseReader(url, "-1", timeout=30, headers=bearer(other["token"]))
    try:
        sse.read_until(lambda ev: any(e.event == "control" for e in ev))
        survivor.read_until(lambda ev: any(e.event == "control" for e in ev))
        poll = Background(lambda: request("GET", url + "?offset=now&live=long-poll", auth, timeout=30))
        time.sleep(0.3)  # let the long-poll park
        status, _ = srv.admin("DELETE", f"/v1/admin/tokens/{token['id']}")
        assert status == 204
        revoked_at = time.monotonic()
        events = sse.read_to_eof(timeout=1.0)
        assert events[-1].json() == {
            "streamNextOffset": "0000000000000000_0000000000000005",
            "credentialRevoked": True,
        }
        lp_status, _, _ = poll.result(timeout=1.0)
        assert lp_status == 204
        assert time.monotonic() - revoked_at < 1.0
        assert request("GET", url + "?offset=-1", auth)[0] == 401
        # The other token's reader is untouched.
        assert request("POST", url, {**OPERATOR, **TEXT}, b"!")[0] == 204
        survivor.read_until(lambda ev: "".join(e.data for e in ev if e.event == "data") == "hello!")
    finally:
        sse.close()
        survivor.close()


def test_rotation_keeps_the_old_tokens_reads_until_the_grace_ends(srv: AuthServer) -> None:
    url = stream(srv, "rotate")
    old = srv.token("acme", "read")
    status, new = srv.admin("POST", f"/v1/admin/tokens/{old['id']}/rotate", {"grace_s": 2})
    assert status == 201 and new["replaces"] == old["id"] and new["scope"] == "read"
    listed = {t["id"]: t for t in srv.admin("GET", "/v1/admin/tokens?bucket=acme")[1]["tokens"]}
    assert listed[old["id"]]["expires_ms"] is not None and "token" not in listed[old["id"]]
    with SseReader(url, "-1", timeout=15, headers=bearer(old["token"])) as sse:
        assert sse.status == 200
        events = sse.read_to_eof(timeout=15)
    assert events[-1].json()["credentialExpired"] is True
    assert request("GET", url + "?offset=-1", bearer(old["token"]))[0] == 401
    assert request("GET", url + "?offset=-1", bearer(new["token"]))[2] == b"hello"
