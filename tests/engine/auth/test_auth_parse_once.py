"""The tenant wall holds whatever the spelling: the access check judges the request the route serves.

Reproductions of issue 18's defects 1-3, on both HTTP adapters. On fb04ba4,
where the access layer read raw strings the route parsed again, 16 of these 24
cases failed (every reproduction; the other spellings are controls):

1. A fork whose ``Stream-Forked-From`` the access layer decoded twice (and,
   failing, skipped) copied another tenant's stream: now 404 as for a stream
   the caller cannot see, and nothing is created.
2. ``li%76e=sse`` / ``l%69ve=long-poll`` is a live read for the route and now
   for the check too: counted as ``live``, held to ``max_live_readers``, and
   ended when its token is revoked.
3. Public read opens a bucket's streams and description to anyone, and
   nothing that changes state: consumer groups (join, heartbeat with commits,
   leave) and subscriptions (claim) still need a credential with a grant.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.auth_support import JSON, OPERATOR, AuthServer, bearer
from tests.support.http_helpers import Background, SseReader, error_code, request

pytestmark = pytest.mark.timeout(180)
TEXT = {"Content-Type": "text/plain"}
SECRET = b"SECRET"


@pytest.fixture(scope="module", params=["granian", "aiohttp"])
def srv(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthServer]:
    s = AuthServer(
        tmp_path_factory.mktemp(f"parse-once-{request.param}") / "data",
        "--http-server",
        request.param,
        "--long-poll-timeout-s",
        "3",
        "--sse-max-connection-s",
        "30",
    ).start()
    try:
        for bucket in ("aaa", "bbb", "pub"):
            s.bucket(bucket)
        yield s
    finally:
        s.stop()


def usage_requests(srv: AuthServer, bucket: str) -> dict[str, int]:
    status, body = srv.admin("GET", f"/v1/admin/usage?bucket={bucket}")
    assert status == 200, body
    [row] = body["buckets"]
    requests: dict[str, int] = row["requests"]
    return requests


# --------------------------------------------------------------------------- defect 1


@pytest.mark.parametrize(
    "source",
    [
        "/v1/buckets/bbb/stream/pct%%30%30",  # decoded twice by the old check: a bad name, check skipped
        "/v1/buckets/bbb/stream/pct%2500",  # the stream's own spelling
        "/v1/buckets/b%62b/stream/pct%25%30%30",
        "/v1/buckets/bbb/stream/pct%2500?offset=-1",
    ],
)
def test_a_fork_from_another_tenants_stream_is_404_however_the_source_is_spelled(
    srv: AuthServer, source: str
) -> None:
    victim = f"{srv.url}/v1/buckets/bbb/stream/pct%2500"
    status, _, body = request("PUT", victim, {**OPERATOR, **TEXT}, SECRET)
    assert status in (200, 201), body
    write_aaa = bearer(srv.token("aaa", "write")["token"])
    stolen = f"{srv.url}/v1/buckets/aaa/stream/stolen-{abs(hash(source))}"
    status, _, body = request("PUT", stolen, {**write_aaa, **TEXT, "Stream-Forked-From": source})
    assert (status, error_code(body)) == (404, "FORK_SOURCE_NOT_FOUND"), body
    status, _, body = request("GET", stolen + "?offset=-1", OPERATOR)
    assert status == 404 and SECRET not in body  # nothing was created


def test_a_caller_who_may_read_the_source_forks_it_by_its_one_spelling(srv: AuthServer) -> None:
    victim = f"{srv.url}/v1/buckets/bbb/stream/pct%2500"
    request("PUT", victim, {**OPERATOR, **TEXT}, SECRET)
    both = bearer(srv.jwt("tiered:aaa:write tiered:bbb:read"))
    fork = f"{srv.url}/v1/buckets/aaa/stream/allowed-fork"
    headers = {**both, **TEXT, "Stream-Forked-From": "/v1/buckets/b%62b/stream/pct%2500"}
    assert request("PUT", fork, headers)[0] == 201
    assert request("GET", fork + "?offset=-1", both)[2] == SECRET
    # A stray '%' names no stream for anyone: the route and the check refuse it alike.
    headers["Stream-Forked-From"] = "/v1/buckets/bbb/stream/pct%%30%30"
    status, _, body = request("PUT", fork + "-2", headers)
    assert (status, error_code(body)) == (404, "FORK_SOURCE_NOT_FOUND")


# --------------------------------------------------------------------------- defect 2


@pytest.mark.parametrize(
    "query", ["offset=-1&li%76e=long-poll", "offset=-1&l%69ve=long-poll", "%6Fffset=-1&live=long-poll"]
)
def test_an_encoded_live_key_is_counted_as_a_live_read(srv: AuthServer, query: str) -> None:
    url = f"{srv.url}/v1/buckets/aaa/stream/counted"
    request("PUT", url, {**OPERATOR, **TEXT}, b"data")
    read = bearer(srv.token("aaa", "read")["token"])
    before = usage_requests(srv, "aaa")
    status, headers, body = request("GET", f"{url}?{query}", read)
    assert (status, body) == (200, b"data")
    assert "Stream-Cursor" in headers  # the route served it as a live read...
    after = usage_requests(srv, "aaa")
    assert (after["live"] - before["live"], after["read"] - before["read"]) == (
        1,
        0,
    )  # ...and so did the check


def test_an_encoded_live_key_holds_one_of_the_buckets_live_slots(srv: AuthServer) -> None:
    url = f"{srv.url}/v1/buckets/aaa/stream/slots"
    request("PUT", url, {**OPERATOR, **TEXT}, b"x")
    assert srv.admin("PUT", "/v1/admin/quotas/aaa", {"max_live_readers": 1})[0] == 200
    read = bearer(srv.token("aaa", "read")["token"])

    def refused_while_parked(holder: str, probe: str) -> None:
        """``holder`` parks (offset=now) in the only slot; ``probe`` (offset=-1: no wait when admitted) is 429."""
        parked = Background(lambda: request("GET", f"{url}?offset=now&{holder}", read, timeout=30))
        deadline = time.monotonic() + 10
        while True:
            status, _, body = request("GET", f"{url}?offset=-1&{probe}", read)
            if status == 429:
                break
            assert status == 200 and time.monotonic() < deadline, (status, body)  # not parked yet
            time.sleep(0.02)
        assert error_code(body) == "RATE_LIMITED" and b"max_live_readers" in body
        assert parked.result(timeout=15)[0] == 204  # the holder's long-poll timed out as usual

    try:
        refused_while_parked("l%69ve=long-poll", "live=long-poll")
        refused_while_parked("live=long-poll", "li%76e=long-poll")
    finally:
        assert srv.admin("PUT", "/v1/admin/quotas/aaa", {"max_live_readers": None})[0] == 200


def test_a_revoked_tokens_encoded_sse_ends_and_sees_nothing_appended_after(srv: AuthServer) -> None:
    url = f"{srv.url}/v1/buckets/aaa/stream/revoked-sse"
    request("PUT", url, {**OPERATOR, **TEXT}, b"before")
    token = srv.token("aaa", "read")
    with SseReader(
        url, "-1", timeout=30, headers=bearer(token["token"]), raw_query="offset=-1&li%76e=sse"
    ) as sse:
        assert sse.status == 200
        sse.read_until(lambda ev: "".join(e.data for e in ev if e.event == "data") == "before")
        assert srv.admin("DELETE", f"/v1/admin/tokens/{token['id']}")[0] == 204
        assert request("POST", url, {**OPERATOR, **TEXT}, b"after")[0] == 204
        events = sse.read_to_eof(timeout=10)
    assert "".join(e.data for e in events if e.event == "data") == "before"
    assert events[-1].json() == {
        "streamNextOffset": "0000000000000000_0000000000000006",
        "credentialRevoked": True,
    }


# --------------------------------------------------------------------------- defect 3


def _group_state(srv: AuthServer, group: str) -> Any:
    status, body = srv.admin("GET", f"/v1/groups/{group}")
    assert status == 200, body
    return body


def test_public_read_does_not_let_anyone_drive_a_consumer_group(srv: AuthServer) -> None:
    assert srv.admin("PUT", "/v1/admin/access/pub", {"public_read": True})[0] == 200
    try:
        url = f"{srv.url}/v1/buckets/pub/stream/p/a"
        request("PUT", url, {**OPERATOR, **TEXT}, b"0123456789")
        assert srv.admin("PUT", "/v1/groups/gpub", {"bucket": "pub", "pattern": "p/*"})[0] in (200, 201)
        worker = bearer(srv.token("pub", "read")["token"])
        status, _, body = request(
            "POST", srv.url + "/v1/groups/gpub/join", {**worker, **JSON}, b'{"member":"w1","join_id":"real"}'
        )
        assert status == 200, body
        real = json.loads(body)
        before = _group_state(srv, "gpub")
        tail = "0000000000000000_0000000000000010"
        commit = {"stream": "p/a", "fence": real["assignments"][0]["fence"], "offset": tail}
        member = {"member": "w1", "incarnation": real["incarnation"], "generation": real["generation"]}
        attacks = [
            ("/v1/groups/gpub/join", {"member": "w1", "join_id": "evil"}),
            ("/v1/groups/gpub/heartbeat", {**member, "commits": [commit]}),
            ("/v1/groups/gpub/leave", {**member, "commits": [commit]}),
        ]
        other = bearer(srv.token("aaa", "admin")["token"])
        for path, payload in attacks:
            for who, want in (({}, 401), (other, 404)):
                status, _, body = request(
                    "POST", srv.url + path, {**who, **JSON}, json.dumps(payload).encode()
                )
                assert status == want, (path, who, body)
        assert _group_state(srv, "gpub") == before  # no fence, no cursor moved
        # The real worker is untouched: its heartbeat still holds its assignment at cursor 0.
        status, _, body = request(
            "POST", srv.url + "/v1/groups/gpub/heartbeat", {**worker, **JSON}, json.dumps(member).encode()
        )
        assert status == 200, body
        assert json.loads(body)["assignments"][0]["cursor"] == "0000000000000000_0000000000000000"
        # What public read is for still works without a credential.
        assert request("GET", url + "?offset=-1")[2] == b"0123456789"
        assert request("GET", srv.url + "/v1/buckets/pub")[0] == 200
    finally:
        assert srv.admin("PUT", "/v1/admin/access/pub", {"public_read": False})[0] == 200


def test_public_read_of_the_default_bucket_does_not_let_anyone_claim_wakes(srv: AuthServer) -> None:
    request("PUT", srv.url + "/v1/stream/wakes", {**OPERATOR, **JSON}, b"")
    request("PUT", srv.url + "/v1/stream/jobs/a", {**OPERATOR, **TEXT}, b"job")
    sub = {"type": "pull-wake", "pattern": "jobs/*", "wake_stream": "wakes"}
    assert srv.admin("PUT", "/v1/stream/__ds/subscriptions/subpub", sub)[0] in (200, 201)
    assert srv.admin("PUT", "/v1/admin/access/default", {"public_read": True})[0] == 200
    try:
        request("POST", srv.url + "/v1/stream/jobs/a", {**OPERATOR, **TEXT}, b" more")
        claim = srv.url + "/v1/stream/__ds/subscriptions/subpub/claim"
        other = bearer(srv.token("aaa", "admin")["token"])
        for who, want in (({}, 401), (other, 404)):
            status, _, body = request("POST", claim, {**who, **JSON}, b'{"worker": "evil"}')
            assert status == want, body
        before = srv.admin("GET", "/v1/stream/__ds/subscriptions/subpub")
        for method, path, payload in (
            ("PUT", "/v1/stream/__ds/subscriptions/evil", sub),
            ("DELETE", "/v1/stream/__ds/subscriptions/subpub", None),
            ("POST", "/v1/stream/__ds/subscriptions/subpub/streams", {"streams": ["jobs/b"]}),
        ):
            data = b"" if payload is None else json.dumps(payload).encode()
            assert request(method, srv.url + path, JSON, data)[0] == 401
        assert srv.admin("GET", "/v1/stream/__ds/subscriptions/subpub") == before
        assert srv.admin("GET", "/v1/stream/__ds/subscriptions/evil")[0] == 404
        # A default-bucket reader still claims (read scope is what claiming needs).
        reader = bearer(srv.token("default", "read")["token"])
        deadline = time.monotonic() + 10
        while True:
            status, _, body = request("POST", claim, {**reader, **JSON}, b'{"worker": "w1"}')
            if status == 200:
                break
            assert status == 409 and time.monotonic() < deadline, (
                body
            )  # NO_PENDING_WORK until the wake is due
            time.sleep(0.05)
    finally:
        assert srv.admin("PUT", "/v1/admin/access/default", {"public_read": False})[0] == 200
