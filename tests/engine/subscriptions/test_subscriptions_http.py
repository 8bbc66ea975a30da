"""The reserved subscription APIs over HTTP: every route, every error code, exact bodies.

Black-box against ``tiered serve``; webhook receivers are aiohttp test servers
on 127.0.0.1 (the development exception to the webhook URL rules). The last
two codes (``TOKEN_EXPIRED``, ``UNAVAILABLE``) need a clock jump or a failed
disk, so they run against an in-process server.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.gc_support import HttpHarness, VirtualClock, make_config
from tests.support.http_helpers import append, create, module_server, read, request, stream_url, unique
from tests.support.server_process import ServerProcess
from tests.support.subscription_helpers import WebhookReceiver, call, verify_signature, wait_until
from tiered.core.ids import format_offset

pytestmark = pytest.mark.timeout(90)

ZERO = format_offset(0)
ISO_RE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
WAKE_ID_RE = re.compile(r"w_[0-9a-f]{24}")
NOT_FOUND = {"error": {"code": "SUBSCRIPTION_NOT_FOUND", "message": "Subscription not found"}}
ROUTE_NOT_FOUND = {
    "error": {"code": "SUBSCRIPTION_NOT_FOUND", "message": "Durable Streams control route not found"}
}
FENCED = {"error": {"code": "FENCED", "message": "Wake generation is stale"}}
NO_AUTH = {"error": {"code": "TOKEN_INVALID", "message": "Missing or malformed Authorization header"}}
BAD_TOKEN = {"error": {"code": "TOKEN_INVALID", "message": "Token invalid"}}


def invalid(message: str) -> dict[str, Any]:
    return {"error": {"code": "INVALID_REQUEST", "message": message}}


def invalid_offset(message: str) -> dict[str, Any]:
    return {"error": {"code": "INVALID_OFFSET", "message": message}}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from module_server(tmp_path_factory, "subscriptions", "--webhook-allow-loopback", "true")


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as r:
        yield r


def sub_url(srv: ServerProcess, sub_id: str, *rest: str) -> str:
    return "/".join([f"{srv.url}/v1/stream/__ds/subscriptions/{sub_id}", *rest])


def jwks(srv: ServerProcess) -> dict[str, Any]:
    status, body, headers = call("GET", f"{srv.url}/v1/stream/__ds/jwks.json")
    assert status == 200
    return body


def make_stream(
    srv: ServerProcess, path: str, data: str = "", content_type: str = "application/json"
) -> None:
    status, _, _ = create(stream_url(srv.url, path), content_type, data)
    assert status == 201, status


def get_sub(srv: ServerProcess, sub_id: str) -> dict[str, Any]:
    status, body, _ = call("GET", sub_url(srv, sub_id))
    assert status == 200, body
    return body


def webhook_sub(srv: ServerProcess, sub_id: str, url: str, pattern: str, **extra: Any) -> dict[str, Any]:
    status, body, _ = call(
        "PUT", sub_url(srv, sub_id), {"type": "webhook", "pattern": pattern, "webhook": {"url": url}, **extra}
    )
    assert status == 201, body
    return body


def pull_sub(srv: ServerProcess, sub_id: str, pattern: str, wake_stream: str, **extra: Any) -> dict[str, Any]:
    status, body, _ = call(
        "PUT",
        sub_url(srv, sub_id),
        {"type": "pull-wake", "pattern": pattern, "wake_stream": wake_stream, **extra},
    )
    assert status == 201, body
    return body


def wake_events(srv: ServerProcess, wake_stream: str) -> list[dict[str, Any]]:
    status, _, raw = read(stream_url(srv.url, wake_stream), "-1")
    assert status == 200
    return json.loads(raw)


# --------------------------------------------------------------------------- create / read / delete


def test_create_reconfirm_conflict_and_read(srv: ServerProcess, receiver: WebhookReceiver) -> None:
    ns = unique("cr")
    make_stream(srv, f"{ns}/old", '{"a":1}')
    sid = unique("sub")
    config = {
        "type": "webhook",
        "pattern": f"{ns}/*",
        "streams": [f"{ns}/manual"],
        "webhook": {"url": receiver.url},
        "lease_ttl_ms": 1000,
        "description": "test subscription",
    }
    status, created, headers = call("PUT", sub_url(srv, sid), config)
    assert status == 201
    assert headers["Content-Type"] == "application/json"
    keys = jwks(srv)["keys"]
    assert len(keys) == 1
    assert ISO_RE.fullmatch(created["created_at"])
    assert created == {
        "id": sid,
        "subscription_id": sid,
        "type": "webhook",
        "pattern": f"{ns}/*",
        "streams": [
            {"path": f"{ns}/manual", "link_type": "explicit", "acked_offset": "-1"},
            {"path": f"{ns}/old", "link_type": "glob", "acked_offset": format_offset(8)},
        ],
        "webhook": {
            "url": receiver.url,
            "signing": {
                "alg": "ed25519",
                "kid": keys[0]["kid"],
                "jwks_url": f"{srv.url}/v1/stream/__ds/jwks.json",
            },
        },
        "wake_stream": None,
        "lease_ttl_ms": 1000,
        "created_at": created["created_at"],
        "status": "active",
        "description": "test subscription",
    }
    # The same configuration (streams in another order, with slashes) re-confirms: 200, same body.
    same = {**config, "streams": [f"/{ns}/manual/", f"{ns}/manual"]}
    status, confirmed, _ = call("PUT", sub_url(srv, sid), same)
    assert (status, confirmed) == (200, created)
    status, body, _ = call("PUT", sub_url(srv, sid), {**config, "description": "another"})
    assert (status, body) == (
        409,
        {
            "error": {
                "code": "SUBSCRIPTION_ALREADY_EXISTS",
                "message": "Subscription already exists with different configuration",
            }
        },
    )
    status, body, headers = call("GET", sub_url(srv, sid))
    assert (status, body) == (200, created)
    assert headers["Cache-Control"] == "no-store"
    assert "webhook_secret" not in json.dumps(body)
    status, _, _ = call("HEAD", sub_url(srv, sid))
    assert status == 200


def test_create_pull_wake_defaults(srv: ServerProcess) -> None:
    sid = unique("pw")
    status, body, _ = call(
        "PUT", sub_url(srv, sid), {"type": "pull-wake", "streams": ["x/y"], "wake_stream": "/w/p/"}
    )
    assert status == 201
    assert body == {
        "id": sid,
        "subscription_id": sid,
        "type": "pull-wake",
        "pattern": None,
        "streams": [{"path": "x/y", "link_type": "explicit", "acked_offset": "-1"}],
        "webhook": None,
        "wake_stream": "w/p",
        "lease_ttl_ms": 30000,
        "created_at": body["created_at"],
        "status": "active",
        "description": None,
    }


@pytest.mark.parametrize(
    "body, expected",
    [
        (b"{not json", invalid("invalid JSON body: JSON is malformed: object keys must be strings (byte 1)")),
        (b"", invalid('type must be "webhook" or "pull-wake"')),
        (b"[1]", invalid("Request body must be a JSON object")),
        (
            {"type": "webhook", "webhook": {"url": "https://h.example.com"}},
            invalid("At least one of pattern or streams is required"),
        ),
        (
            {"type": "pull-wake", "pattern": "a/*", "wake_stream": "w", "lease_ttl_ms": 999},
            invalid("lease_ttl_ms must be an integer from 1000 to 600000"),
        ),
        (
            {"type": "pull-wake", "pattern": "a/*", "wake_stream": "w", "lease_ttl_ms": 600001},
            invalid("lease_ttl_ms must be an integer from 1000 to 600000"),
        ),
        ({"type": "webhook", "pattern": "a/*"}, invalid("webhook subscriptions require webhook.url")),
        ({"type": "pull-wake", "pattern": "a/*"}, invalid("pull-wake subscriptions require wake_stream")),
        (
            {"type": "pull-wake", "pattern": "a/b*", "wake_stream": "w"},
            invalid("pattern wildcards must be whole path segments: * (one segment) or ** (any number)"),
        ),
        (
            {"type": "pull-wake", "streams": ["__ds/x"], "wake_stream": "w"},
            invalid("streams entry '__ds/x' is under the reserved __ds/ prefix"),
        ),
    ],
)
def test_create_rejects_invalid_requests(srv: ServerProcess, body: Any, expected: dict[str, Any]) -> None:
    status, resp, _ = call("PUT", sub_url(srv, unique("bad")), body)
    assert (status, resp) == (400, expected)


@pytest.mark.parametrize(
    "url, message",
    [
        (
            "http://10.0.0.1/hook",
            "webhook.url must be an https URL (plain http only to loopback, for development)",
        ),
        (
            "https://169.254.169.254/latest",
            "webhook.url must not target private, loopback, link-local or reserved addresses",
        ),
        (
            "https://192.168.0.10/hook",
            "webhook.url must not target private, loopback, link-local or reserved addresses",
        ),
        (
            "https://[fe80::1]/hook",
            "webhook.url must not target private, loopback, link-local or reserved addresses",
        ),
        (
            "https://[64:ff9b::a9fe:a9fe]/",
            "webhook.url must not target private, loopback, link-local or reserved addresses",
        ),
        ("https://db.internal/hook", "webhook.url must not target local network names"),
    ],
)
def test_create_rejects_unsafe_webhook_urls(srv: ServerProcess, url: str, message: str) -> None:
    sid = unique("ssrf")
    status, body, _ = call(
        "PUT", sub_url(srv, sid), {"type": "webhook", "pattern": "a/*", "webhook": {"url": url}}
    )
    assert (status, body) == (400, {"error": {"code": "WEBHOOK_URL_REJECTED", "message": message}})
    assert call("GET", sub_url(srv, sid))[0] == 404


def test_read_and_delete(srv: ServerProcess) -> None:
    sid = unique("del")
    assert call("GET", sub_url(srv, sid))[:2] == (404, NOT_FOUND)
    pull_sub(srv, sid, "d/*", "w")
    status, body, _ = call("DELETE", sub_url(srv, sid))
    assert (status, body) == (204, None)
    assert call("GET", sub_url(srv, sid))[:2] == (404, NOT_FOUND)
    assert call("DELETE", sub_url(srv, sid))[0] == 204  # deleting again: still 204


# --------------------------------------------------------------------------- explicit streams


def test_add_and_remove_explicit_streams(srv: ServerProcess) -> None:
    ns = unique("ex")
    make_stream(srv, f"{ns}/g", '{"x":1}')
    make_stream(srv, f"{ns}/m/deep", '{"x":22}')
    sid = unique("ex")
    pull_sub(srv, sid, f"{ns}/*", "w")
    assert call("POST", sub_url(srv, sid, "streams"), {"streams": [f"{ns}/m/deep", f"{ns}/g", "nowhere/x"]})[
        :2
    ] == (204, None)
    assert call("POST", sub_url(srv, sid, "streams"), {"streams": [f"{ns}/m/deep"]})[0] == 204  # idempotent
    assert get_sub(srv, sid)["streams"] == [
        {"path": f"{ns}/g", "link_type": "explicit", "acked_offset": format_offset(8)},
        {"path": f"{ns}/m/deep", "link_type": "explicit", "acked_offset": format_offset(9)},
        {"path": "nowhere/x", "link_type": "explicit", "acked_offset": "-1"},
    ]
    encoded = f"{ns}%2Fm%2Fdeep"
    assert call("DELETE", sub_url(srv, sid, "streams", encoded))[:2] == (204, None)
    assert call("DELETE", sub_url(srv, sid, "streams", encoded))[0] == 204  # absent: idempotent
    assert call("DELETE", sub_url(srv, sid, "streams", f"{ns}/g"))[0] == 204  # raw slashes work too
    assert call("DELETE", sub_url(srv, sid, "streams", "nowhere", "x"))[0] == 204
    # Removing the explicit link leaves the glob link.
    assert get_sub(srv, sid)["streams"] == [
        {"path": f"{ns}/g", "link_type": "glob", "acked_offset": format_offset(8)}
    ]
    for body in ({"streams": []}, {"streams": "x"}, {}):
        assert call("POST", sub_url(srv, sid, "streams"), body)[:2] == (
            400,
            invalid("streams must be a non-empty array of stream paths"),
        )
    assert call("POST", sub_url(srv, sid, "streams"), {"streams": ["w"]})[:2] == (
        400,
        invalid("a subscription's wake_stream cannot also be one of its streams"),
    )
    assert call("DELETE", sub_url(srv, sid, "streams", ""))[:2] == (400, invalid("the stream path is empty"))
    assert call("POST", sub_url(srv, "missing-sub", "streams"), {"streams": ["a"]})[:2] == (404, NOT_FOUND)
    assert call("DELETE", sub_url(srv, "missing-sub", "streams", "a"))[:2] == (404, NOT_FOUND)


# --------------------------------------------------------------------------- keys, routing


def test_jwks(srv: ServerProcess) -> None:
    status, body, headers = call("GET", f"{srv.url}/v1/stream/__ds/jwks.json")
    assert status == 200
    assert headers["Content-Type"] == "application/jwk-set+json"
    assert headers["Cache-Control"] == "public, max-age=300"
    [key] = body["keys"]
    assert set(key) == {"kty", "crv", "kid", "use", "alg", "x"}
    assert (key["kty"], key["crv"], key["use"], key["alg"]) == ("OKP", "Ed25519", "sig", "EdDSA")
    assert re.fullmatch(r"ds_[A-Za-z0-9_-]{43}", key["kid"]) and re.fullmatch(r"[A-Za-z0-9_-]{43}", key["x"])
    status, body, headers = call("POST", f"{srv.url}/v1/stream/__ds/jwks.json", {})
    assert (status, body) == (
        405,
        {"error": {"code": "METHOD_NOT_ALLOWED", "message": "method POST is not allowed here"}},
    )
    assert headers["Allow"] == "GET, HEAD"


def test_control_namespace_routing(srv: ServerProcess) -> None:
    for method, path in [
        ("GET", "/v1/stream/__ds"),
        ("GET", "/v1/stream/__ds/"),
        ("PUT", "/v1/stream/__ds/x"),
        ("GET", "/v1/stream/__ds/subscriptions/"),
        ("GET", "/v1/stream/__ds/subscriptions/a/b"),
        ("POST", "/v1/stream/__ds/subscriptions/a/claim/x"),
    ]:
        assert call(method, srv.url + path)[:2] == (404, ROUTE_NOT_FOUND), path
    sid = unique("rt")
    pull_sub(srv, sid, "rt/*", "w")
    status, body, headers = call("POST", sub_url(srv, sid), {})
    assert (status, body) == (
        405,
        {"error": {"code": "METHOD_NOT_ALLOWED", "message": "method POST is not allowed here"}},
    )
    assert headers["Allow"] == "PUT, GET, HEAD, DELETE"
    assert call("GET", sub_url(srv, sid, "claim"))[0] == 405
    assert call("GET", sub_url(srv, sid, "streams"))[0] == 405
    assert call("GET", sub_url(srv, sid, "streams", "x"))[0] == 405
    # Percent-encoded control segments are the same routes.
    assert call("GET", f"{srv.url}/v1/stream/%5F%5Fds/subscriptions/{sid}")[0] == 200
    assert call("GET", f"{srv.url}/v1/stream/__ds/subscriptions/a%20b")[:2] == (
        400,
        invalid(
            "subscription ids are 1-256 bytes without spaces, control characters or slashes, and not '.' or '..'"
        ),
    )
    # __ds is never an application stream, through any URL shape; __dsx is an ordinary name.
    status, _, raw = request(
        "PUT", f"{srv.url}/v1/buckets/default/stream/__ds/x", {"Content-Type": "text/plain"}, b""
    )
    assert (status, json.loads(raw)) == (
        400,
        {
            "error": {
                "code": "BAD_REQUEST",
                "message": "stream paths whose first segment is __ds are reserved for Durable Streams control APIs",
            }
        },
    )
    status, _, _ = request(
        "PUT", f"{srv.url}/v1/stream/__ds%2Fsubscriptions%2Fx", {"Content-Type": "text/plain"}, b""
    )
    assert status == 400
    assert create(stream_url(srv.url, unique("__dsx")), "text/plain")[0] == 201


# --------------------------------------------------------------------------- webhooks


def test_webhook_wake_is_signed_and_the_callback_acks_and_fences(
    srv: ServerProcess, receiver: WebhookReceiver
) -> None:
    ns, sid = unique("wh"), unique("wh")
    webhook_sub(srv, sid, receiver.url, f"{ns}/*", lease_ttl_ms=60000)
    path = f"{ns}/a"
    make_stream(srv, path, '{"event":"created"}')
    note = receiver.wait_for(1)
    assert verify_signature(note, jwks(srv))
    assert note.headers["Content-Type"] == "application/json"
    assert re.fullmatch(
        r"t=\d+,kid=ds_[A-Za-z0-9_-]+,ed25519=[A-Za-z0-9_-]+", note.headers["Webhook-Signature"]
    )
    body = note.body
    tail = format_offset(20)
    callback_url = sub_url(srv, sid, "callback")
    assert WAKE_ID_RE.fullmatch(body["wake_id"])
    assert body == {
        "subscription_id": sid,
        "wake_id": body["wake_id"],
        "generation": 1,
        "streams": [
            {
                "path": path,
                "link_type": "glob",
                "acked_offset": "-1",
                "tail_offset": tail,
                "has_pending": True,
            }
        ],
        "callback_url": callback_url,
        "callback_token": body["callback_token"],
    }
    token = body["callback_token"]
    ack = {"wake_id": body["wake_id"], "generation": 1, "acks": [{"stream": path, "offset": tail}]}
    assert call("POST", callback_url, ack)[:2] == (401, NO_AUTH)
    assert call("POST", callback_url, ack, headers={"Authorization": f"Basic {token}"})[:2] == (401, NO_AUTH)
    assert call("POST", callback_url, ack, token="not.valid")[:2] == (401, BAD_TOKEN)
    assert call("POST", callback_url, {**ack, "generation": 2}, token=token)[:2] == (409, FENCED)
    assert call("POST", callback_url, {**ack, "wake_id": "w_other"}, token=token)[:2] == (409, FENCED)
    assert call(
        "POST", callback_url, {**ack, "acks": [{"stream": path, "offset": format_offset(21)}]}, token=token
    )[:2] == (409, invalid_offset("Ack offset is beyond stream tail"))
    assert call("POST", callback_url, {**ack, "acks": [{"stream": "other", "offset": tail}]}, token=token)[
        :2
    ] == (409, invalid_offset("Ack references an unknown subscription stream"))
    assert call("POST", callback_url, {**ack, "acks": [{"stream": path, "offset": "-1"}]}, token=token)[
        :2
    ] == (409, invalid_offset("Ack offset must not be -1"))
    assert call("POST", callback_url, {"generation": 1}, token=token)[:2] == (
        400,
        invalid("wake_id must be a non-empty string"),
    )
    # A heartbeat with an ack, then done.
    assert call("POST", callback_url, ack, token=token)[:2] == (200, {"ok": True, "next_wake": False})
    assert call("POST", callback_url, {**ack, "acks": [{"stream": path, "offset": ZERO}]}, token=token)[
        :2
    ] == (409, invalid_offset("Ack offset regresses the committed cursor"))
    assert call("POST", callback_url, {**ack, "done": True}, token=token)[:2] == (
        200,
        {"ok": True, "next_wake": False},
    )
    assert call("POST", callback_url, {**ack, "done": True}, token=token)[:2] == (409, FENCED)
    sub = get_sub(srv, sid)
    assert sub["streams"] == [{"path": path, "link_type": "glob", "acked_offset": tail}]
    assert sub["status"] == "active"
    # New data: a new wake, generation 2; the old token is stale for it.
    append(stream_url(srv.url, path), '{"event":"second"}', "application/json")
    second = receiver.wait_for(2).body
    assert second["generation"] == 2 and second["streams"][0]["acked_offset"] == tail
    assert call("POST", callback_url, {"wake_id": second["wake_id"], "generation": 2}, token=token)[:2] == (
        409,
        FENCED,
    )
    # A deleted subscription refuses callbacks and moves nothing.
    assert call("DELETE", sub_url(srv, sid))[0] == 204
    done = {"wake_id": second["wake_id"], "generation": 2, "done": True}
    assert call("POST", callback_url, done, token=second["callback_token"])[:2] == (404, NOT_FOUND)


def test_webhook_done_auto_acks_the_wake_snapshot(srv: ServerProcess) -> None:
    ns, sid = unique("sync"), unique("sync")
    with WebhookReceiver(lambda i, body: (200, {"done": True})) as rx:
        webhook_sub(srv, sid, rx.url, f"{ns}/*", lease_ttl_ms=1000)
        make_stream(srv, f"{ns}/a", '{"n":1}')
        first = rx.wait_for(1).body
        tail = first["streams"][0]["tail_offset"]
        wait_until(lambda: get_sub(srv, sid)["streams"][0]["acked_offset"] == tail)
        append(stream_url(srv.url, f"{ns}/a"), '{"n":2}', "application/json")
        second = rx.wait_for(2).body
        assert second["generation"] == 2 and second["streams"][0]["acked_offset"] == tail
        wait_until(
            lambda: get_sub(srv, sid)["streams"][0]["acked_offset"] == second["streams"][0]["tail_offset"]
        )


def test_failed_deliveries_are_retried_with_backoff(srv: ServerProcess) -> None:
    ns, sid = unique("retry"), unique("retry")
    with WebhookReceiver(lambda i, body: (500, {}) if i == 0 else (200, {"done": True})) as rx:
        webhook_sub(srv, sid, rx.url, f"{ns}/*")
        make_stream(srv, f"{ns}/a", '{"n":1}')
        first = rx.wait_for(1)
        wait_until(lambda: get_sub(srv, sid)["status"] == "failed")
        second = rx.wait_for(2)
        assert 0.7 <= second.at - first.at <= 3.0  # 1 s +-20%, plus scheduling
        assert second.body["wake_id"] == first.body["wake_id"]  # the same wake, retried
        wait_until(lambda: get_sub(srv, sid)["status"] == "active")


def test_unacknowledged_webhook_wake_expires_and_is_redelivered(
    srv: ServerProcess, receiver: WebhookReceiver
) -> None:
    ns, sid = unique("lease"), unique("lease")
    webhook_sub(srv, sid, receiver.url, f"{ns}/*", lease_ttl_ms=1000)
    make_stream(srv, f"{ns}/a", '{"n":1}')
    first = receiver.wait_for(1)
    second = receiver.wait_for(2, timeout=5)
    assert second.body["generation"] == 2 and second.body["wake_id"] != first.body["wake_id"]
    assert 0.8 <= second.at - first.at <= 4.0
    old = first.body
    assert call(
        "POST",
        old["callback_url"],
        {"wake_id": old["wake_id"], "generation": 1, "done": True},
        token=old["callback_token"],
    )[:2] == (409, FENCED)


# --------------------------------------------------------------------------- pull-wake


def test_pull_wake_claim_ack_release(srv: ServerProcess) -> None:
    ns, sid, wake = unique("pull"), unique("pull"), unique("wake")
    make_stream(srv, wake, "[]")
    pull_sub(srv, sid, f"{ns}/*", wake, lease_ttl_ms=60000)
    claim_url = sub_url(srv, sid, "claim")
    assert call("POST", claim_url, {"worker": "w1"})[:2] == (
        409,
        {"error": {"code": "NO_PENDING_WORK", "message": "Subscription has no pending work"}},
    )
    path = f"{ns}/a"
    make_stream(srv, path, '{"event":"created"}')
    events = wait_until(lambda: wake_events(srv, wake))
    assert events == [
        {"type": "wake", "subscription_id": sid, "stream": path, "generation": 1, "ts": events[0]["ts"]}
    ]
    assert abs(events[0]["ts"] - time.time() * 1000) < 10_000
    status, claimed, _ = call("POST", claim_url, {"worker": "w1"})
    assert status == 200
    tail = format_offset(20)
    assert claimed == {
        "wake_id": claimed["wake_id"],
        "generation": 1,
        "token": claimed["token"],
        "streams": [
            {
                "path": path,
                "link_type": "glob",
                "acked_offset": "-1",
                "tail_offset": tail,
                "has_pending": True,
            }
        ],
        "lease_ttl_ms": 60000,
    }
    assert call("POST", claim_url, {"worker": "w2"})[:2] == (
        409,
        {
            "error": {
                "code": "ALREADY_CLAIMED",
                "message": "The wake is already claimed",
                "current_holder": "w1",
                "generation": 1,
            }
        },
    )
    token, ack_url = claimed["token"], sub_url(srv, sid, "ack")
    base = {"wake_id": claimed["wake_id"], "generation": 1}
    assert call("POST", ack_url, base)[:2] == (401, NO_AUTH)
    assert call("POST", ack_url, {**base, "generation": 0}, token=token)[:2] == (409, FENCED)
    assert call("POST", ack_url, base, token=token)[:2] == (
        200,
        {"ok": True, "next_wake": False},
    )  # heartbeat
    done = {**base, "acks": [{"stream": path, "offset": tail}], "done": True}
    assert call("POST", ack_url, done, token=token)[:2] == (200, {"ok": True, "next_wake": False})
    assert call("POST", ack_url, done, token=token)[:2] == (409, FENCED)
    assert get_sub(srv, sid)["streams"] == [{"path": path, "link_type": "glob", "acked_offset": tail}]
    # More data: a second wake event; claim it and release it without acking.
    append(stream_url(srv.url, path), '{"event":"second"}', "application/json")
    wait_until(lambda: len(wake_events(srv, wake)) == 2)
    status, claimed2, _ = call("POST", claim_url, {"worker": "w1"})
    assert status == 200 and claimed2["generation"] == 2
    release_url = sub_url(srv, sid, "release")
    base2 = {"wake_id": claimed2["wake_id"], "generation": 2}
    assert call("POST", release_url, base2)[:2] == (401, NO_AUTH)
    assert call("POST", release_url, base2, token=token)[:2] == (409, FENCED)  # the first wake's token
    assert call("POST", release_url, base2, token=claimed2["token"])[:2] == (204, None)
    assert call("POST", release_url, base2, token=claimed2["token"])[:2] == (409, FENCED)
    # The work is still pending, so another wake event follows for a later claim.
    events = wait_until(lambda: (e := wake_events(srv, wake)) and len(e) == 3 and e)
    assert [e["generation"] for e in events] == [1, 2, 3]
    assert call("POST", claim_url, {"worker": "w9"})[1]["generation"] == 3


def test_pull_wake_errors(srv: ServerProcess, receiver: WebhookReceiver) -> None:
    hook, pw = unique("hook"), unique("pw")
    webhook_sub(srv, hook, receiver.url, f"{unique('none')}/*")
    pull_sub(srv, pw, f"{unique('none')}/*", "w")
    not_pull = invalid("Subscription is not pull-wake")
    assert call("POST", sub_url(srv, hook, "claim"), {"worker": "w"})[:2] == (400, not_pull)
    assert call("POST", sub_url(srv, hook, "ack"), {"wake_id": "w", "generation": 1}, token="x")[:2] == (
        400,
        not_pull,
    )
    assert call("POST", sub_url(srv, hook, "release"), {"wake_id": "w", "generation": 1}, token="x")[:2] == (
        400,
        not_pull,
    )
    for body in ({}, {"worker": ""}, {"worker": 5}):
        assert call("POST", sub_url(srv, pw, "claim"), body)[:2] == (
            400,
            invalid("worker must be 1-256 characters without control characters"),
        )
    assert call("POST", sub_url(srv, pw, "claim"), b"{oops")[:2] == (
        400,
        invalid("invalid JSON body: JSON is malformed: object keys must be strings (byte 1)"),
    )
    assert call("POST", sub_url(srv, pw, "ack"), {"wake_id": "w", "generation": 1}, token="x.y")[:2] == (
        401,
        BAD_TOKEN,
    )
    assert call("POST", sub_url(srv, pw, "release"), {"wake_id": "w", "generation": 1}, token="x.y")[:2] == (
        401,
        BAD_TOKEN,
    )
    assert call("POST", sub_url(srv, pw, "release"), {"wake_id": "w"}, token="x.y")[:2] == (
        400,
        invalid("generation must be an integer from 0 to 9007199254740991"),
    )
    for action in ("claim", "ack", "release", "callback"):
        status, body, _ = call(
            "POST",
            sub_url(srv, "no-such-sub", action),
            {"worker": "w", "wake_id": "w", "generation": 1},
            token="x",
        )
        assert (status, body) == (404, NOT_FOUND), action


# --------------------------------------------------------------------------- in process: clock & disk


def test_token_expired_and_journal_unavailable(tmp_path: Path) -> None:
    """A token 25 hours old is expired (virtual clock, advanced); a journal that cannot write is UNAVAILABLE."""
    clock = VirtualClock()

    async def scenario() -> None:
        h = HttpHarness(make_config(tmp_path / "data", long_poll_timeout_s=1), clock=clock)
        await h.start()
        try:

            async def call_(
                method: str, path: str, body: Any = None, token: str | None = None
            ) -> tuple[int, Any, Any]:
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                status, resp_headers, raw = await h.http(method, path, json_body=body, headers=headers)
                return status, json.loads(raw) if raw else None, resp_headers

            json_ct = {"Content-Type": "application/json"}
            assert (await h.http("PUT", "/v1/stream/wake", headers=json_ct, body="[]"))[0] == 201
            sub = {"type": "pull-wake", "pattern": "jobs/*", "wake_stream": "wake"}
            assert (await call_("PUT", "/v1/stream/__ds/subscriptions/p", sub))[0] == 201
            await h.http("PUT", "/v1/stream/jobs/a", headers=json_ct, body='{"x":1}')
            status, claimed, _ = await call_("POST", "/v1/stream/__ds/subscriptions/p/claim", {"worker": "w"})
            assert status == 200
            clock.advance(25 * 3600 * 1000)
            ack = {"wake_id": claimed["wake_id"], "generation": claimed["generation"]}
            assert (await call_("POST", "/v1/stream/__ds/subscriptions/p/ack", ack, claimed["token"]))[
                :2
            ] == (401, {"error": {"code": "TOKEN_EXPIRED", "message": "Token expired"}})
            h.s.journal.failed = OSError("disk on fire")
            try:
                status, body, headers = await call_("PUT", "/v1/stream/__ds/subscriptions/q", sub)
            finally:
                h.s.journal.failed = None
            assert (status, body) == (
                503,
                {
                    "error": {
                        "code": "UNAVAILABLE",
                        "retry_after_s": 5,
                        "message": "the journal cannot write to disk; restart the server",
                    }
                },
            )
            assert headers["Retry-After"] == "5"
            assert (await call_("GET", "/v1/stream/__ds/subscriptions/q"))[0] == 404
        finally:
            await h.stop()

    asyncio.run(scenario())


def test_webhooks_switch_and_public_url(tmp_path: Path) -> None:
    off = ServerProcess(
        tmp_path / "off",
        "--long-poll-timeout-s",
        "2",
        "--webhooks",
        "false",
        "--webhook-allow-loopback",
        "true",
    ).start()
    try:
        status, body, _ = call(
            "PUT",
            sub_url(off, "h"),
            {"type": "webhook", "pattern": "a/*", "webhook": {"url": "https://hooks.example.com/x"}},
        )
        assert (status, body) == (400, invalid("webhook subscriptions are not enabled on this server"))
        assert (
            call("PUT", sub_url(off, "p"), {"type": "pull-wake", "pattern": "a/*", "wake_stream": "w"})[0]
            == 201
        )
    finally:
        off.stop()
    public = "https://streams.example.com/root"
    srv = ServerProcess(
        tmp_path / "on",
        "--long-poll-timeout-s",
        "2",
        "--public-url",
        public + "/",
        "--webhook-allow-loopback",
        "true",
    ).start()
    try:
        with WebhookReceiver() as rx:
            created = webhook_sub(srv, "h", rx.url, "pub/*")
            assert created["webhook"]["signing"]["jwks_url"] == f"{public}/v1/stream/__ds/jwks.json"
            make_stream(srv, "pub/a", '{"x":1}')
            assert rx.wait_for(1).body["callback_url"] == f"{public}/v1/stream/__ds/subscriptions/h/callback"
    finally:
        srv.stop()
