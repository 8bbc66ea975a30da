"""Buckets: /v1/buckets, /v1/buckets/{bucket}, and streams addressed inside a bucket.

Each test runs on one node and on a single-node cluster of 4 shards (listings and
descriptions merged over shards): the server fixture's deployments (``tests/support/deployments.py``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from tests.support import deployments
from tests.support.http_helpers import (
    append,
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


@pytest.fixture(scope="module", params=deployments.SINGLE_AND_CLUSTER)
def srv(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    yield from deployments.module_server(request, "buckets")


def bucket_name() -> str:
    return unique("b").lower()


def test_fresh_server_lists_only_the_default_bucket(server: ServerProcess) -> None:
    status, headers, body = request("GET", server.url + "/v1/buckets")
    assert status == 200
    assert headers["Content-Type"].startswith("application/json")
    assert [b["name"] for b in json.loads(body)["buckets"]] == ["default"]


def test_put_bucket_is_201_then_200_and_listed(srv: ServerProcess) -> None:
    names = ["zeta-bucket", "alpha-bucket", "m00"]
    listed_before = json.loads(request("GET", srv.url + "/v1/buckets")[2])["buckets"]
    for name in names:
        status, _, body = request("PUT", f"{srv.url}/v1/buckets/{name}")
        assert status == 201
        assert json.loads(body) == {"name": name}
        status, _, body = request("PUT", f"{srv.url}/v1/buckets/{name}")
        assert status == 200
        assert json.loads(body) == {"name": name}
    listed = json.loads(request("GET", srv.url + "/v1/buckets")[2])["buckets"]
    assert [b["name"] for b in listed] == sorted([*names, *(b["name"] for b in listed_before)])
    assert "default" in [b["name"] for b in listed]
    for b in listed:
        assert isinstance(b["created_ms"], int)
    # The default bucket always exists.
    assert request("PUT", f"{srv.url}/v1/buckets/default")[0] == 200


def test_get_bucket_describes_it(srv: ServerProcess) -> None:
    name = bucket_name()
    before = int(time.time() * 1000)
    request("PUT", f"{srv.url}/v1/buckets/{name}")
    status, _, body = request("GET", f"{srv.url}/v1/buckets/{name}")
    assert status == 200
    info = json.loads(body)
    assert info["name"] == name
    assert info["streams"] == 0
    assert before - 5000 <= info["created_ms"] <= int(time.time() * 1000) + 5000
    create(stream_url(srv.url, "one", bucket=name), "text/plain")
    create(stream_url(srv.url, "two/nested", bucket=name), "text/plain")
    create(stream_url(srv.url, "elsewhere"), "text/plain")
    assert json.loads(request("GET", f"{srv.url}/v1/buckets/{name}")[2])["streams"] == 2
    request("DELETE", stream_url(srv.url, "one", bucket=name))
    assert json.loads(request("GET", f"{srv.url}/v1/buckets/{name}")[2])["streams"] == 1


def test_missing_bucket_is_404(srv: ServerProcess) -> None:
    status, _, body = request("GET", f"{srv.url}/v1/buckets/not-there")
    assert status == 404
    assert error_message(body)
    u = stream_url(srv.url, "x", bucket="not-there")
    status, _, body = create(u, "text/plain")
    assert status == 404
    assert "bucket" in error_message(body)
    assert read(u)[0] == 404
    assert head(u)[0] == 404
    assert append(u, "x", "text/plain")[0] == 404
    assert request("DELETE", u)[0] == 404
    # ...and nothing was created as a side effect.
    assert request("GET", f"{srv.url}/v1/buckets/not-there")[0] == 404


@pytest.mark.parametrize("name", ["AB1", "ab", "a_b", "-abc", "abc-", "a" * 64, "a.b", "%2e%2e", "%41bc"])
def test_invalid_bucket_name_is_400(srv: ServerProcess, name: str) -> None:
    status, _, body = request("PUT", f"{srv.url}/v1/buckets/{name}")
    assert status == 400
    assert error_message(body)
    names = [b["name"] for b in json.loads(request("GET", srv.url + "/v1/buckets")[2])["buckets"]]
    assert name not in names and name.lower() not in names


def test_boundary_bucket_names_are_accepted(srv: ServerProcess) -> None:
    for name in ("abc", "a" * 63, "0-9", "a-b-c"):
        assert request("PUT", f"{srv.url}/v1/buckets/{name}")[0] == 201, name


def test_same_path_in_different_buckets_is_a_different_stream(srv: ServerProcess) -> None:
    b1, b2 = bucket_name(), bucket_name()
    for b in (b1, b2):
        request("PUT", f"{srv.url}/v1/buckets/{b}")
    default = stream_url(srv.url, "shared/name")
    in_b1 = stream_url(srv.url, "shared/name", bucket=b1)
    in_b2 = stream_url(srv.url, "shared/name", bucket=b2)
    assert create(default, "text/plain", "default")[0] == 201
    status, headers, _ = create(in_b1, "application/json", '["b1"]')
    assert status == 201
    assert headers["Location"] == in_b1
    assert create(in_b2, "application/octet-stream", b"\x00b2")[0] == 201
    assert read(default)[2] == b"default"
    assert read(in_b1)[2] == b'["b1"]'
    assert read(in_b2)[2] == b"\x00b2"
    # Deleting one leaves the others.
    assert request("DELETE", in_b1)[0] == 204
    assert read(default)[2] == b"default"
    assert read(in_b2)[2] == b"\x00b2"
    assert read(in_b1)[0] == 404


def test_default_bucket_url_and_short_url_are_the_same_stream(srv: ServerProcess) -> None:
    short = stream_url(srv.url, "same")
    explicit = stream_url(srv.url, "same", bucket="default")
    assert create(short, "text/plain", "a")[0] == 201
    assert create(explicit, "text/plain")[0] == 200
    append(explicit, "b", "text/plain")
    assert read(short)[2] == b"ab"


def test_bucket_streams_support_the_whole_protocol(srv: ServerProcess) -> None:
    b = bucket_name()
    request("PUT", f"{srv.url}/v1/buckets/{b}")
    u = stream_url(srv.url, "full", bucket=b)
    create(u, "text/plain", "one,")
    headers = {"Content-Type": "text/plain", "Producer-Id": "p", "Producer-Epoch": "0", "Producer-Seq": "0"}
    assert request("POST", u, headers, "two,")[0] == 200
    assert request("POST", u, headers, "two,")[0] == 204
    assert read(u, "-1", live="long-poll")[2] == b"one,two,"
    f = stream_url(srv.url, "fork-of-full")
    assert request("PUT", f, {"Stream-Forked-From": f"/v1/buckets/{b}/stream/full"}, b"")[0] == 201
    assert read(f)[2] == b"one,two,"


def test_bucket_stream_count_excludes_expired_streams(srv: ServerProcess) -> None:
    b = bucket_name()
    request("PUT", f"{srv.url}/v1/buckets/{b}")
    u = stream_url(srv.url, "ephemeral", bucket=b)
    create(u, "text/plain", Stream_TTL="1")
    assert json.loads(request("GET", f"{srv.url}/v1/buckets/{b}")[2])["streams"] == 1
    time.sleep(1.3)
    assert head(u)[0] == 404
    assert json.loads(request("GET", f"{srv.url}/v1/buckets/{b}")[2])["streams"] == 0
