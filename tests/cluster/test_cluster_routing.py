"""Which shard serves a request: the same key on every node, both spellings of a stream in one shard.

Keys come from the request's parsed target (``tiered.api.kit.target``), the value
the access check and the routes read: a path that does not parse is refused
where it arrives, never hashed raw.
"""

from __future__ import annotations

import pytest

from tiered.api.kit.target import parse_target
from tiered.cluster.gateway.routing import SUBSCRIPTIONS_KEY, bucket_write, is_write, shard_key
from tiered.cluster.membership.shards import shard_of
from tiered.core.errors import TieredError


def route_key(path: str, method: str = "GET") -> tuple[str, str] | None:
    return shard_key(parse_target(method, path, {}, {}))


def test_stream_urls_key_on_bucket_and_decoded_path() -> None:
    assert route_key("/v1/stream/a/b") == ("default", "a/b")
    assert route_key("/v1/buckets/default/stream/a/b") == ("default", "a/b")
    assert route_key("/v1/stream/a%2Fb") == ("default", "a/b")
    assert route_key("/v1/buckets/logs/stream/x") == ("logs", "x")
    assert route_key("/v1/buckets/l%6Fgs/stream/%78") == ("logs", "x")


@pytest.mark.parametrize(
    "path", ["/v1/stream/%ff", "/v1/stream/a%%30%30", "/v1/stream/a/../b", "/v1/buckets/X/stream/a"]
)
def test_a_path_that_does_not_parse_has_no_key_but_a_400(path: str) -> None:
    with pytest.raises(TieredError) as exc:
        route_key(path)
    assert exc.value.code.value == "BAD_REQUEST"


def test_buckets_groups_admin_and_subscriptions_have_well_known_shards() -> None:
    assert route_key("/v1/buckets/logs") == ("logs", "")
    assert route_key("/v1/groups/g1/join") == ("default", "__groups/g1")
    assert route_key("/v1/groups/g1") == route_key("/v1/groups/g1/heartbeat")
    assert route_key("/v1/admin/retention/logs") == ("logs", "")
    assert route_key("/v1/admin/retention/logs/a/b") == ("logs", "a/b")
    assert route_key("/v1/admin/retain/logs/a") == ("logs", "a")
    assert route_key("/v1/admin/quotas/logs") == route_key("/v1/admin/access/logs") == ("logs", "")
    assert route_key("/v1/stream/__ds/subscriptions/s1") == SUBSCRIPTIONS_KEY
    assert route_key("/v1/stream/__ds") == SUBSCRIPTIONS_KEY
    assert route_key("/v1/stream/__ds/jwks.json") == SUBSCRIPTIONS_KEY


def test_node_requests_have_no_shard() -> None:
    for path in ("/healthz", "/readyz", "/metrics", "/v1/buckets", "/v1/groups", "/v1/admin/gc", "/"):
        assert route_key(path) is None, path


def test_spellings_of_one_stream_meet_in_one_shard() -> None:
    a, b = route_key("/v1/stream/x%20y"), route_key("/v1/buckets/default/stream/x y")
    assert a is not None and b is not None and shard_of(*a, 64) == shard_of(*b, 64)


def test_only_reads_are_not_writes() -> None:
    assert not is_write("GET") and not is_write("HEAD") and not is_write("OPTIONS")
    assert is_write("POST") and is_write("PUT") and is_write("DELETE")


def test_bucket_creates_and_erases_go_to_every_shard() -> None:
    def write(method: str, path: str) -> str | None:
        return bucket_write(method, parse_target(method, path, {}, {}))

    assert write("PUT", "/v1/buckets/logs") == "logs"
    assert write("DELETE", "/v1/buckets/logs") == "logs"
    assert write("GET", "/v1/buckets/logs") is None
    assert write("PUT", "/v1/buckets/logs/stream/a") is None
    assert write("PUT", "/v1/buckets/") is None
