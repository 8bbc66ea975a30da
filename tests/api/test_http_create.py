"""Create (PUT): 201, idempotent 200, 409 on a different configuration, 400 on bad headers.

Each test runs on one node and on a single-node cluster (every shard's engine behind
shard routing): the server fixture's deployments (``tests/support/deployments.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.support import deployments
from tests.support.http_helpers import (
    append,
    assert_security_headers,
    close,
    create,
    error_message,
    head,
    read,
    request,
    stream_url,
    unique,
)
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.timeout(60)

ZERO = "0000000000000000_0000000000000000"
OFFSET_RE = re.compile(r"\d{16}_\d{16}")


@pytest.fixture(scope="module", params=deployments.SINGLE_AND_CLUSTER)
def srv(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    yield from deployments.module_server(request, "create")


def url(srv: ServerProcess, prefix: str = "create") -> str:
    return stream_url(srv.url, unique(prefix))


def test_create_returns_201_with_location_content_type_and_tail(srv: ServerProcess) -> None:
    u = url(srv)
    status, headers, body = create(u, "text/plain")
    assert status == 201
    assert body == b""
    assert headers["Location"] == u
    assert headers["Content-Type"] == "text/plain"
    assert headers["Stream-Next-Offset"] == ZERO
    assert "Stream-Closed" not in headers
    assert_security_headers(headers)


def test_location_drops_the_query_string(srv: ServerProcess) -> None:
    u = url(srv)
    status, headers, _ = request("PUT", u + "?foo=bar", {"Content-Type": "text/plain"}, b"")
    assert status == 201
    assert headers["Location"] == u


def test_repeated_create_with_same_config_is_200_without_location(srv: ServerProcess) -> None:
    u = url(srv)
    assert create(u, "application/x-thing", Stream_TTL="3600")[0] == 201
    append(u, b"abc", "application/x-thing")
    status, headers, _ = create(u, "application/x-thing", Stream_TTL="3600")
    assert status == 200
    assert "Location" not in headers
    assert headers["Content-Type"] == "application/x-thing"
    # The idempotent answer reports the current tail, not the creation-time one.
    assert headers["Stream-Next-Offset"] == head(u)[1]["Stream-Next-Offset"]
    assert headers["Stream-Next-Offset"] != ZERO
    # ...and does not touch the data.
    assert read(u)[2] == b"abc"


def test_content_type_defaults_to_octet_stream(srv: ServerProcess) -> None:
    u = url(srv)
    status, headers, _ = create(u, None)
    assert status == 201
    assert headers["Content-Type"] == "application/octet-stream"
    assert head(u)[1]["Content-Type"] == "application/octet-stream"
    # Re-creating without a Content-Type matches the default; naming it explicitly does too.
    assert create(u, None)[0] == 200
    assert create(u, "application/octet-stream")[0] == 200


def test_content_type_comparison_ignores_parameters_and_case(srv: ServerProcess) -> None:
    u = url(srv)
    assert create(u, "text/plain; charset=utf-8")[0] == 201
    assert create(u, "text/plain")[0] == 200
    assert create(u, "TEXT/Plain;charset=latin-1")[0] == 200
    # The stream keeps the content type it was created with.
    assert head(u)[1]["Content-Type"] == "text/plain; charset=utf-8"


def test_create_with_initial_body(srv: ServerProcess) -> None:
    u = url(srv)
    payload = bytes(range(256))
    status, headers, _ = create(u, "application/octet-stream", payload)
    assert status == 201
    assert headers["Stream-Next-Offset"] != ZERO
    assert headers["Stream-Next-Offset"] == head(u)[1]["Stream-Next-Offset"]
    assert read(u)[2] == payload


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"Content-Type": "text/plain"}, {"Content-Type": "application/json"}),
        ({"Content-Type": "text/plain"}, {}),
        ({"Content-Type": "text/plain", "Stream-TTL": "100"}, {"Content-Type": "text/plain"}),
        (
            {"Content-Type": "text/plain", "Stream-TTL": "100"},
            {"Content-Type": "text/plain", "Stream-TTL": "101"},
        ),
        ({"Content-Type": "text/plain"}, {"Content-Type": "text/plain", "Stream-TTL": "100"}),
        (
            {"Content-Type": "text/plain", "Stream-Expires-At": "2999-01-01T00:00:00Z"},
            {"Content-Type": "text/plain", "Stream-Expires-At": "2999-01-01T00:00:01Z"},
        ),
        (
            {"Content-Type": "text/plain", "Stream-Expires-At": "2999-01-01T00:00:00Z"},
            {"Content-Type": "text/plain", "Stream-TTL": "100"},
        ),
        ({"Content-Type": "text/plain"}, {"Content-Type": "text/plain", "Stream-Closed": "true"}),
    ],
    ids=[
        "type",
        "type-vs-default",
        "ttl-dropped",
        "ttl-changed",
        "ttl-added",
        "expires-changed",
        "expires-vs-ttl",
        "closed-vs-open",
    ],
)
def test_create_with_different_config_is_409_and_changes_nothing(
    srv: ServerProcess, first: dict[str, str], second: dict[str, str]
) -> None:
    u = url(srv)
    assert request("PUT", u, first, b"")[0] == 201
    before = head(u)[1]
    status, headers, body = request("PUT", u, second, b"")
    assert status == 409, body
    assert error_message(body)
    assert_security_headers(headers)
    after = head(u)[1]
    for name in ("Content-Type", "Stream-Next-Offset", "Stream-TTL", "Stream-Expires-At", "Stream-Closed"):
        assert after.get(name) == before.get(name), name


def test_closure_status_is_part_of_the_config(srv: ServerProcess) -> None:
    u = url(srv)
    assert create(u, "text/plain")[0] == 201
    # Stream-Closed: true against an open stream: mismatch.
    assert create(u, "text/plain", Stream_Closed="true")[0] == 409
    assert "Stream-Closed" not in head(u)[1]
    assert close(u)[0] == 204
    # Now the stream is closed: a PUT without Stream-Closed no longer matches...
    status, _, _ = create(u, "text/plain")
    assert status == 409
    # ...and one with it does, reporting the closure.
    status, headers, _ = create(u, "text/plain", Stream_Closed="true")
    assert status == 200
    assert headers["Stream-Closed"] == "true"


@pytest.mark.parametrize("value", ["false", "yes", "1", ""])
def test_stream_closed_values_other_than_true_are_ignored(srv: ServerProcess, value: str) -> None:
    u = url(srv)
    status, headers, _ = create(u, "text/plain", Stream_Closed=value)
    assert status == 201
    assert "Stream-Closed" not in headers
    assert "Stream-Closed" not in head(u)[1]
    assert create(u, "text/plain")[0] == 200
    assert create(u, "text/plain", Stream_Closed=value)[0] == 200


def test_stream_closed_true_is_case_insensitive(srv: ServerProcess) -> None:
    u = url(srv)
    status, headers, _ = create(u, "text/plain", Stream_Closed="TRUE")
    assert status == 201
    assert headers["Stream-Closed"] == "true"
    assert head(u)[1]["Stream-Closed"] == "true"


def test_create_closed_with_body_is_final_content(srv: ServerProcess) -> None:
    u = url(srv)
    status, headers, _ = create(u, "text/plain", "the whole story", Stream_Closed="true")
    assert status == 201
    assert headers["Stream-Closed"] == "true"
    status, headers, body = read(u)
    assert body == b"the whole story"
    assert headers["Stream-Closed"] == "true"
    status, headers, _ = append(u, "more", "text/plain")
    assert status == 409
    assert headers["Stream-Closed"] == "true"


def test_create_closed_empty(srv: ServerProcess) -> None:
    u = url(srv)
    status, headers, _ = create(u, "text/plain", Stream_Closed="true")
    assert status == 201
    assert headers["Stream-Next-Offset"] == ZERO
    status, headers, body = read(u, "-1")
    assert (status, body) == (200, b"")
    assert headers["Stream-Closed"] == "true"
    assert headers["Stream-Up-To-Date"] == "true"


def test_ttl_and_expires_at_together_is_400_and_creates_nothing(srv: ServerProcess) -> None:
    u = url(srv)
    status, headers, body = create(u, "text/plain", Stream_TTL="60", Stream_Expires_At="2999-01-01T00:00:00Z")
    assert status == 400
    assert error_message(body)
    assert headers["Content-Type"] == "application/json"
    assert head(u)[0] == 404


def test_ttl_and_expires_at_are_reported_and_matched(srv: ServerProcess) -> None:
    u1, u2 = url(srv), url(srv)
    assert create(u1, "text/plain", Stream_TTL="3600")[0] == 201
    h = head(u1)[1]
    assert h["Stream-TTL"] == "3600"
    assert "Stream-Expires-At" not in h
    assert create(u1, "text/plain", Stream_TTL="3600")[0] == 200

    assert create(u2, "text/plain", Stream_Expires_At="2999-06-01T12:00:00Z")[0] == 201
    h = head(u2)[1]
    assert h["Stream-Expires-At"] == "2999-06-01T12:00:00Z"
    assert "Stream-TTL" not in h
    # The same instant written differently is the same configuration.
    assert create(u2, "text/plain", Stream_Expires_At="2999-06-01T14:00:00+02:00")[0] == 200
    assert create(u2, "text/plain", Stream_Expires_At="2999-06-01T12:00:00.000Z")[0] == 200
    # The originally supplied text is what HEAD keeps echoing.
    assert head(u2)[1]["Stream-Expires-At"] == "2999-06-01T12:00:00Z"


@pytest.mark.parametrize("content_type", ["text", "/plain", "text/", "text/pl ain", ""])
def test_invalid_content_type_is_400(srv: ServerProcess, content_type: str) -> None:
    u = url(srv)
    status, _, body = request("PUT", u, {"Content-Type": content_type}, b"")
    assert status == 400, body
    assert head(u)[0] == 404


def test_create_after_delete_is_a_fresh_stream(srv: ServerProcess) -> None:
    u = url(srv)
    assert create(u, "text/plain", "old data")[0] == 201
    old_etag = read(u)[1]["ETag"]
    assert request("DELETE", u)[0] == 204
    status, headers, _ = create(u, "application/json")
    assert status == 201
    # Above every offset of the deleted stream ("old data": 0..8): never reused.
    assert headers["Stream-Next-Offset"] == "0000000000000000_0000000000000009"
    assert read(u, ZERO)[0] == 410
    status, headers, body = read(u)
    assert body == b"[]"
    assert headers["Content-Type"] == "application/json"
    assert headers["ETag"] != old_etag


def test_offsets_are_fixed_width_tokens_that_sort(srv: ServerProcess) -> None:
    u = url(srv)
    _, h0, _ = create(u, "application/octet-stream")
    offsets = [h0["Stream-Next-Offset"]]
    for i in range(1, 12):
        offsets.append(append(u, b"x" * i)[1]["Stream-Next-Offset"])
    for off in offsets:
        assert OFFSET_RE.fullmatch(off)
        assert off not in ("-1", "now")
    assert offsets == sorted(offsets)
    assert len(set(offsets)) == len(offsets)


def test_create_in_missing_bucket_is_404(srv: ServerProcess) -> None:
    status, _, body = create(stream_url(srv.url, unique("x"), bucket="no-such-bucket"), "text/plain")
    assert status == 404
    assert "bucket" in error_message(body)
