"""Listing a bucket's streams (issue 22): ``GET /v1/buckets/{b}/streams`` and ``GET /v1/stream``.

Each test runs on one node and on a single-node cluster of 4 shards (every shard answers its page,
the pages merged by one cursor), with token auth on so that scopes are judged as in production.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.support import deployments
from tests.support.deadlines import Deadline
from tests.support.http_helpers import request, stream_url, unique
from tests.support.server_process import ServerProcess
from tiered.core.errors import TieredError
from tiered.core.ids import format_offset

pytestmark = pytest.mark.timeout(120)

ADMIN = "listing-admin-token-0123456789"
OPERATOR = {"Authorization": f"Bearer {ADMIN}"}


@pytest.fixture(scope="module", params=deployments.SINGLE_AND_CLUSTER)
def srv(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    token_file: Path = tmp_path_factory.mktemp("listing-admin") / "admin-token"
    token_file.write_text(ADMIN + "\n")
    yield from deployments.module_server(
        request, "listing", "--auth", "tokens", "--admin-token-file", str(token_file)
    )


def new_bucket(srv: ServerProcess) -> str:
    name = "l" + unique("b")[-12:].replace("-", "").lower()
    status = request("PUT", f"{srv.url}/v1/buckets/{name}", OPERATOR)[0]
    assert status == 201
    return name


def issue(srv: ServerProcess, bucket: str, scope: str = "read", prefix: str | None = None) -> dict[str, str]:
    body: dict[str, Any] = {"bucket": bucket, "scope": scope}
    if prefix is not None:
        body["prefix"] = prefix
    deadline = Deadline(30)
    while True:
        status, _, out = request(
            "POST",
            srv.url + "/v1/admin/tokens",
            {**OPERATOR, "Content-Type": "application/json"},
            json.dumps(body).encode(),
        )
        if status != 503 or deadline.expired():
            break
    assert status == 201, out
    return {"Authorization": f"Bearer {json.loads(out)['token']}"}


def listing(
    srv: ServerProcess, bucket: str | None, headers: dict[str, str] | None = None, **query: Any
) -> tuple[int, dict[str, Any]]:
    base = f"{srv.url}/v1/buckets/{bucket}/streams" if bucket is not None else f"{srv.url}/v1/stream"
    qs = "&".join(f"{k}={quote(str(v), safe='')}" for k, v in query.items())
    status, _, body = request(
        "GET", base + ("?" + qs if qs else ""), OPERATOR if headers is None else headers
    )
    return status, json.loads(body) if body else {}


def all_pages(
    srv: ServerProcess, bucket: str | None, limit: int, headers: dict[str, str] | None = None, **query: Any
) -> list[str]:
    """Every path, page by page; each page's cursor the previous page's ``next_after``."""
    paths: list[str] = []
    after = query.pop("after", "")
    for _ in range(10_000):
        status, page = listing(srv, bucket, headers, limit=limit, after=after, **query)
        assert status == 200, page
        assert len(page["streams"]) <= limit
        paths += [row["path"] for row in page["streams"]]
        if not page["has_more"]:
            assert page["next_after"] is None
            return paths
        assert page["next_after"] == page["streams"][-1]["path"]
        after = page["next_after"]
    raise AssertionError("the listing never ended")


def mk(srv: ServerProcess, bucket: str, path: str, ct: str = "text/plain") -> str:
    url = stream_url(srv.url, path, bucket=bucket)
    status = request("PUT", url, {**OPERATOR, "Content-Type": ct})[0]
    assert status == 201
    return url


def test_entries_say_what_each_stream_is(srv: ServerProcess) -> None:
    bucket = new_bucket(srv)
    url = mk(srv, bucket, "orders/eu")
    status = request("POST", url, {**OPERATOR, "Content-Type": "text/plain"}, b"hello")[0]
    assert status == 204
    closed = mk(srv, bucket, "orders/us", "application/json")
    assert request("POST", closed, {**OPERATOR, "Stream-Closed": "true"})[0] == 204
    status, page = listing(srv, bucket)
    assert status == 200
    assert page["has_more"] is False and page["next_after"] is None and page["limit"] == 1000
    rows = page["streams"]
    assert [r["path"] for r in rows] == ["orders/eu", "orders/us"]
    eu, us = rows
    assert eu["content_type"] == "text/plain" and us["content_type"] == "application/json"
    assert eu["next_offset"] == format_offset(5) and eu["retained_offset"] == format_offset(0)
    assert eu["size_bytes"] == 5 and eu["closed"] is False
    assert us["closed"] is True and us["size_bytes"] == 0
    # Record ordinals: one append of five bytes is one record; the closed JSON stream has none.
    assert (eu["first_record"], eu["next_record"], eu["records"]) == (0, 1, 1)
    assert (us["first_record"], us["next_record"], us["records"]) == (0, 0, 0)
    assert isinstance(eu["created_ms"], int) and eu["created_ms"] > 0


def test_pages_are_complete_ordered_and_filtered_by_prefix(srv: ServerProcess) -> None:
    bucket = new_bucket(srv)
    names = [f"p/{i:03d}" for i in range(23)] + ["q/1", "p", "pz", "p/a/b"]
    for name in names:
        mk(srv, bucket, name)
    assert all_pages(srv, bucket, 4) == sorted(names)
    assert all_pages(srv, bucket, 1000) == sorted(names)
    assert all_pages(srv, bucket, 5, prefix="p/") == sorted(n for n in names if n.startswith("p/"))
    assert all_pages(srv, bucket, 3, prefix="p/0", after="p/010") == [f"p/{i:03d}" for i in range(11, 23)]
    # A deleted stream is no longer listed.
    assert request("DELETE", stream_url(srv.url, "pz", bucket=bucket), OPERATOR)[0] == 204
    assert "pz" not in all_pages(srv, bucket, 7)


def test_the_default_bucket_is_listed_under_v1_stream(srv: ServerProcess) -> None:
    prefix = unique("dflt")
    for i in range(3):
        mk(srv, "default", f"{prefix}/{i}")
    assert all_pages(srv, None, 2, prefix=prefix + "/") == [f"{prefix}/{i}" for i in range(3)]
    # The same streams by the explicit route.
    assert all_pages(srv, "default", 2, prefix=prefix + "/") == [f"{prefix}/{i}" for i in range(3)]


@pytest.mark.parametrize(
    "query",
    ["limit=0", "limit=1001", "limit=-1", "limit=x", "limit=01", "prefix=%07", "after=" + "a" * 5000],
)
def test_bad_queries_are_400(srv: ServerProcess, query: str) -> None:
    status, _, body = request("GET", f"{srv.url}/v1/stream?{query}", OPERATOR)
    assert status == 400, body
    assert json.loads(body)["error"]["code"] == "BAD_REQUEST"


def test_other_methods_are_405_and_unknown_buckets_404(srv: ServerProcess) -> None:
    status, headers, _ = request("POST", f"{srv.url}/v1/stream", OPERATOR, b"x")
    assert status == 405 and headers["Allow"] == "GET"
    assert request("DELETE", f"{srv.url}/v1/buckets/default/streams", OPERATOR)[0] == 405
    status, page = listing(srv, "nosuchbucket7")
    assert status == 404 and page["error"]["code"] == "BUCKET_NOT_FOUND"


def test_a_prefix_limited_token_lists_only_its_prefix(srv: ServerProcess) -> None:
    bucket = new_bucket(srv)
    for name in ("app1", "app1/a", "app1/b/c", "app10", "app2/x", "zzz"):
        mk(srv, bucket, name)
    scoped = issue(srv, bucket, "read", prefix="app1")
    assert all_pages(srv, bucket, 2, scoped) == ["app1", "app1/a", "app1/b/c"]
    assert all_pages(srv, bucket, 2, scoped, prefix="app") == ["app1", "app1/a", "app1/b/c"]
    assert all_pages(srv, bucket, 2, scoped, prefix="app2") == []
    whole = issue(srv, bucket, "write")
    assert len(all_pages(srv, bucket, 2, whole)) == 6
    # No credential: 401; a grant on another bucket only: 404, as if the bucket did not exist.
    assert listing(srv, bucket, {})[0] == 401
    other = issue(srv, new_bucket(srv), "admin")
    status, page = listing(srv, bucket, other)
    assert status == 404 and page["error"]["code"] == "BUCKET_NOT_FOUND"


def test_pagination_under_concurrent_creates_and_deletes_is_complete_and_duplicate_free(
    srv: ServerProcess,
) -> None:
    """Streams that live throughout are all listed once; churned ones at most once; order strictly increasing."""
    bucket = new_bucket(srv)
    stable = [f"s/{i:03d}" for i in range(60)]
    for name in stable:
        mk(srv, bucket, name)
    stop = threading.Event()
    churned: list[str] = []
    errors: list[BaseException] = []

    def churn() -> None:
        try:
            for i in range(400):  # bounded
                if stop.is_set():
                    return
                name = f"s/{(i * 37) % 60:03d}-{i}"  # interleaved with the stable paths
                churned.append(name)
                mk(srv, bucket, name)
                if i % 2:
                    assert request("DELETE", stream_url(srv.url, name, bucket=bucket), OPERATOR)[0] == 204
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    worker = threading.Thread(target=churn)
    worker.start()
    try:
        for _ in range(3):
            paths = all_pages(srv, bucket, 7)
            assert paths == sorted(set(paths)), "strictly increasing: nothing listed twice"
            assert set(stable) <= set(paths), "every stream that lived throughout is listed"
            assert set(paths) <= set(stable) | set(churned)
    finally:
        stop.set()
        worker.join(60)
    assert not errors, errors


def test_tails_move_with_appends(srv: ServerProcess) -> None:
    bucket = new_bucket(srv)
    url = mk(srv, bucket, "t")
    assert request("POST", url, {**OPERATOR, "Content-Type": "text/plain"}, b"abc")[0] == 204
    _, page = listing(srv, bucket)
    assert page["streams"][0]["next_offset"] == format_offset(3)


def test_the_listing_routes_are_classified_once_for_every_layer() -> None:
    """The table's rows: the default bucket's listing is not a stream, a bucket's is keyed by its bucket."""
    from tiered.api.kit.target import Family, parse_target
    from tiered.api.table import Fanout, Kind, classify, shard_key
    from tiered.cluster.gateway.scatter import PLANS

    for path, bucket in (("/v1/stream", "default"), ("/v1/buckets/abc/streams", "abc")):
        target = parse_target("GET", path, {"prefix": "x"}, {})
        assert (target.family, target.bucket, target.stream) == (Family.STREAMS, bucket, None)
        spec = classify("GET", target).spec
        assert spec.handler == "buckets.list_streams" and spec.scope.kind is Kind.BUCKET
        assert spec.fanout is Fanout.SCATTER and spec.scatter is not None and spec.scatter in PLANS
        assert shard_key(target) == (bucket, "")
        assert classify("POST", target).spec.handler is None  # the router's 405
    # With a trailing slash it stays a stream URL (an empty path: 400), never the listing.
    with pytest.raises(TieredError):
        parse_target("GET", "/v1/stream/", {}, {})
    assert parse_target("GET", "/v1/buckets/abc/streams/x", {}, {}).family is Family.OTHER
