"""Browser security and CORS headers (protocol section 12.7) on every kind of response."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.http_helpers import (
    SECURITY_HEADERS,
    SseReader,
    assert_security_headers,
    close,
    create,
    module_server,
    read,
    request,
    stream_url,
    unique,
)
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.timeout(60)

EXPOSED = [
    "Stream-Next-Offset",
    "Stream-Cursor",
    "Stream-Up-To-Date",
    "Stream-Closed",
    "Stream-TTL",
    "Stream-Expires-At",
    "Stream-Sse-Data-Encoding",
    "Producer-Epoch",
    "Producer-Seq",
    "Producer-Expected-Seq",
    "Producer-Received-Seq",
    "ETag",
    "Location",
]
REQUEST_HEADERS = [
    "Content-Type",
    "If-None-Match",
    "Stream-Seq",
    "Stream-TTL",
    "Stream-Expires-At",
    "Stream-Closed",
    "Stream-Forked-From",
    "Stream-Fork-Offset",
    "Stream-Fork-Sub-Offset",
    "Producer-Id",
    "Producer-Epoch",
    "Producer-Seq",
]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from module_server(tmp_path_factory, "security", "--max-body-bytes", "1024")


def split(value: str) -> set[str]:
    return {v.strip().lower() for v in value.split(",")}


def check(headers: object) -> None:
    assert_security_headers(headers)  # type: ignore[arg-type]
    exposed = split(headers["Access-Control-Expose-Headers"])  # type: ignore[index]
    assert {h.lower() for h in EXPOSED} <= exposed


def test_security_headers_on_every_kind_of_response(srv: ServerProcess) -> None:
    u = stream_url(srv.url, unique("sec"))
    closed = stream_url(srv.url, unique("sec"))
    responses = {
        "201 create": request("PUT", u, {"Content-Type": "application/octet-stream"}, b"\x00\x01"),
        "200 create": request("PUT", u, {"Content-Type": "application/octet-stream"}, b""),
        "409 create": request("PUT", u, {"Content-Type": "text/html"}, b""),
        "400 create": request("PUT", u, {"Stream-TTL": "x"}, b""),
        "204 append": request("POST", u, {"Content-Type": "application/octet-stream"}, b"<script>"),
        "400 append": request("POST", u, {}, b"data"),
        "409 append": request("POST", u, {"Content-Type": "text/html"}, b"<html>"),
        "413 append": request("POST", u, {"Content-Type": "application/octet-stream"}, b"x" * 2000),
        "200 read": read(u),
        "304 read": read(u, "-1", {"If-None-Match": read(u)[1]["ETag"]}),
        "400 read": read(u, "bad"),
        "200 now": read(u, "now"),
        "200 long-poll": read(u, "-1", live="long-poll"),
        "200 head": request("HEAD", u),
        "404 head": request("HEAD", stream_url(srv.url, unique("none"))),
        "404 read": read(stream_url(srv.url, unique("none"))),
        "405": request("PATCH", u),
        "404 route": request("GET", srv.url + "/nope"),
        "buckets": request("GET", srv.url + "/v1/buckets"),
        "bucket 201": request("PUT", f"{srv.url}/v1/buckets/{unique('b')}"),
        "bucket 400": request("PUT", f"{srv.url}/v1/buckets/BAD"),
        "bucket 404": request("GET", f"{srv.url}/v1/buckets/nothing-here"),
        "bucket 409 default": request("DELETE", f"{srv.url}/v1/buckets/default"),
        "healthz": request("GET", srv.url + "/healthz"),
        "201 closed": request("PUT", closed, {"Stream-Closed": "true"}, b""),
        "409 closed": request("POST", closed, {"Content-Type": "application/octet-stream"}, b"x"),
        "204 long-poll closed": read(closed, "now", live="long-poll"),
        "204 close": close(u),
        "204 delete": request("DELETE", u),
        "404 after delete": request("POST", u, {"Content-Type": "application/octet-stream"}, b"x"),
    }
    expected = {
        "201 create": 201,
        "200 create": 200,
        "409 create": 409,
        "400 create": 400,
        "204 append": 204,
        "400 append": 400,
        "409 append": 409,
        "413 append": 413,
        "200 read": 200,
        "304 read": 304,
        "400 read": 400,
        "200 now": 200,
        "200 long-poll": 200,
        "200 head": 200,
        "404 head": 404,
        "404 read": 404,
        "405": 405,
        "404 route": 404,
        "buckets": 200,
        "bucket 201": 201,
        "bucket 400": 400,
        "bucket 404": 404,
        "bucket 409 default": 409,
        "healthz": 200,
        "201 closed": 201,
        "409 closed": 409,
        "204 long-poll closed": 204,
        "204 close": 204,
        "204 delete": 204,
        "404 after delete": 404,
    }
    assert set(expected) == set(responses)
    for label, (status, headers, _) in responses.items():
        assert status == expected[label], (label, status)
        try:
            check(headers)
        except AssertionError as exc:
            raise AssertionError(f"{label}: {exc}") from None


def test_security_headers_on_sse(srv: ServerProcess) -> None:
    u = stream_url(srv.url, unique("sec"))
    create(u, "application/octet-stream", b"x", Stream_Closed="true")
    with SseReader(u, "-1") as sse:
        assert sse.status == 200
        check(sse.headers)
        sse.read_to_eof()


@pytest.mark.parametrize(
    "path", ["/v1/stream/anything", "/v1/buckets/default/stream/x", "/v1/buckets", "/nope"]
)
def test_cors_preflight(srv: ServerProcess, path: str) -> None:
    status, headers, body = request(
        "OPTIONS",
        srv.url + path,
        {
            "Origin": "https://example.com",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, producer-id",
        },
    )
    assert status == 204
    assert body == b""
    check(headers)
    assert {"get", "head", "put", "post", "delete", "options"} <= split(
        headers["Access-Control-Allow-Methods"]
    )
    assert {h.lower() for h in REQUEST_HEADERS} <= split(headers["Access-Control-Allow-Headers"])
    assert int(headers["Access-Control-Max-Age"]) > 0


def test_security_header_values(srv: ServerProcess) -> None:
    u = stream_url(srv.url, unique("sec"))
    _, headers, _ = create(u, "text/html", "<script>alert(1)</script>")
    for name, value in SECURITY_HEADERS.items():
        assert headers[name] == value
    status, headers, body = read(u)
    assert body == b"<script>alert(1)</script>"
    # Browsers must not sniff the stream's bytes into something else.
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Content-Type"] == "text/html"


# --------------------------------------------------------------- credentials


def raw_request(
    url: str, method: str, path: str, headers: list[tuple[str, bytes]], body: bytes = b""
) -> tuple[int, bytes]:
    """A request with header values sent as raw bytes (not necessarily UTF-8)."""
    import http.client
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for name, value in headers:
            conn.putheader(name, value)
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with an admin token configured."""
    srv = ServerProcess(
        tmp_path_factory.mktemp("guarded") / "data",
        "--long-poll-timeout-s",
        "2",
        env={"TIERED_ADMIN_TOKEN": "the-admin-token"},
    ).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.mark.parametrize("value", [b"Bearer \xff\xfe", b"Bearer \xc3\x28", b"bearer \x80abc", b"\xff\xfe"])
def test_undecodable_authorization_is_401_not_500(guarded: ServerProcess, value: bytes) -> None:
    for method, path in [("POST", "/v1/admin/gc?dry_run=true"), ("GET", "/metrics"), ("GET", "/v1/admin/gc")]:
        status, body = raw_request(guarded.url, method, path, [("Authorization", value)])
        assert status == 401, (method, path, status, body)


def test_undecodable_callback_token_is_401_not_500(guarded: ServerProcess) -> None:
    sub = unique("sub")
    assert request("PUT", guarded.url + "/v1/stream/wakes", {"Content-Type": "application/json"})[0] == 201
    body = b'{"type": "pull-wake", "streams": ["x"], "wake_stream": "wakes"}'
    assert (
        request(
            "PUT",
            f"{guarded.url}/v1/stream/__ds/subscriptions/{sub}",
            {"Content-Type": "application/json"},
            body,
        )[0]
        == 201
    )
    for action in ("ack", "release", "callback"):
        status, raw = raw_request(
            guarded.url,
            "POST",
            f"/v1/stream/__ds/subscriptions/{sub}/{action}",
            [("Authorization", b"Bearer \xff\xfe.\xff"), ("Content-Type", b"application/json")],
            b'{"wake_id": "w", "generation": 1}',
        )
        assert status == 401, (action, status, raw)


def test_metrics_need_the_admin_token_when_one_is_configured(guarded: ServerProcess) -> None:
    status, headers, body = request("GET", guarded.url + "/metrics")
    assert status == 401 and headers["WWW-Authenticate"] == "Bearer"
    assert b"tiered_" not in body
    assert request("GET", guarded.url + "/metrics", {"Authorization": "Bearer wrong"})[0] == 401
    status, _, body = request("GET", guarded.url + "/metrics", {"Authorization": "Bearer the-admin-token"})
    assert status == 200 and b"tiered_streams" in body


def test_metrics_are_open_on_loopback_without_a_token(srv: ServerProcess) -> None:
    status, _, body = request("GET", srv.url + "/metrics")
    assert status == 200 and b"tiered_streams" in body
