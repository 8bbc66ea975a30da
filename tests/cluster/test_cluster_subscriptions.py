"""Subscriptions fed by every shard on a three-node object-store cluster (``tiered/cluster/features/sub_feed.py``).

The subscriptions live in the shard of ``(default, "__ds")``; the streams of
the test hash to shards two *other* nodes own, and the wake stream to a
third shard. Asserted: a pull-wake subscription links streams of both nodes
by pattern, every append is claimable as soon as it is acknowledged (the
claim names each stream at its acknowledged tail), acks move the cursors, its
wake events land in the other shard's wake stream, and a deleted stream is
unlinked.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster_support import serving, start_nodes, unique_prefix, wait_served
from tests.support.deadlines import scaled
from tests.support.http_helpers import append, create, read_all, request, stream_url, unique
from tests.support.s3_server import S3Endpoint
from tests.support.server_process import ServerProcess
from tiered.cluster.features.sub_feed import FeedBatch, FeedTable
from tiered.cluster.gateway.routing import SUBSCRIPTIONS_KEY
from tiered.cluster.membership.shards import shard_of
from tiered.core.ids import DEFAULT_BUCKET
from tiered.engine.streams.state import StreamState
from tiered.engine.subscriptions.config import parse_config
from tiered.engine.subscriptions.records import (
    LinksSkipped,
    SigningKeyAdded,
    StreamGone,
    StreamsLinked,
    WakeIssued,
)
from tiered.engine.subscriptions.state import CombinedStreams, StateStreams, SubscriptionState

pytestmark = pytest.mark.timeout(120)

SHARDS = 8


@pytest.fixture
def trio(moto_s3: S3Endpoint, tmp_path: Path) -> Iterator[list[ServerProcess]]:
    with start_nodes(
        tmp_path, moto_s3, unique_prefix("xsubs"), shards=SHARDS, ttl_s=4.0, durability="object-store", wal_interval_ms=5
    ) as started:  # fmt: skip
        nodes = list(started.values())
        served = wait_served(nodes, SHARDS, 30, every_node=True)
        assert all(served), served
        yield nodes


def name_in(shards: set[int], prefix: str) -> str:
    for _ in range(1000):
        name = unique(prefix)
        if shard_of(DEFAULT_BUCKET, name, SHARDS) in shards:
            return name
    raise AssertionError(f"no name hashes to {shards}")


def call(method: str, url: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    status, _, data = request(method, url, headers, json.dumps(body).encode() if body is not None else b"")
    return status, json.loads(data) if data else None


def test_pull_wake_subscription_sees_streams_of_two_other_nodes(trio: list[ServerProcess]) -> None:
    subs_shard = shard_of(*SUBSCRIPTIONS_KEY, SHARDS)
    owners = [serving(n) for n in trio]
    others = [i for i, shards in enumerate(owners) if subs_shard not in shards]
    assert len(others) == 2, owners  # every node serves shards; one of them the subscriptions'
    entry = next(n for i, n in enumerate(trio) if i not in others)  # the subscriptions' owner
    a_shards = owners[others[0]]
    b_shards = owners[others[1]]
    wake_name = name_in({s for s in range(SHARDS) if s != subs_shard}, "wake/pool")
    # Pattern-matched paths must hash where we want them: search names under events/.
    path_a = next(p for p in (f"events/a-{i}-{unique()}" for i in range(2000)) if shard_of(DEFAULT_BUCKET, p, SHARDS) in a_shards)  # fmt: skip
    path_b = next(p for p in (f"events/b-{i}-{unique()}" for i in range(2000)) if shard_of(DEFAULT_BUCKET, p, SHARDS) in b_shards)  # fmt: skip
    base = entry.url
    sub = f"{base}/v1/stream/__ds/subscriptions/{unique('sub')}"

    assert create(stream_url(base, wake_name), "application/json", b"[]")[0] == 201
    status, body = call(
        "PUT",
        sub,
        {"type": "pull-wake", "pattern": "events/*", "wake_stream": wake_name, "lease_ttl_ms": 5000},
    )
    assert status == 201, body

    # Created through the two other nodes; each acknowledged append is claimable at once.
    assert create(stream_url(trio[others[0]].url, path_a), "application/json", b'{"n": 1}')[0] == 201
    assert create(stream_url(trio[others[1]].url, path_b), "application/json", b'{"n": 2}')[0] == 201
    status, claimed = call("POST", sub + "/claim", {"worker": "w1"})
    assert status == 200, claimed
    tails = {s["path"]: s["tail_offset"] for s in claimed["streams"]}
    assert set(tails) == {path_a, path_b}
    for path in (path_a, path_b):
        status, headers, _ = request("HEAD", stream_url(base, path))
        assert status == 200 and tails[path] == headers["Stream-Next-Offset"]
    acks = [{"stream": p, "offset": t} for p, t in tails.items()]
    status, answer = call(
        "POST",
        sub + "/ack",
        {"wake_id": claimed["wake_id"], "generation": claimed["generation"], "acks": acks, "done": True},
        claimed["token"],
    )
    assert (status, answer) == (200, {"ok": True, "next_wake": False})

    # An append in B's shard wakes the subscription again, with B pending and A processed.
    assert append(stream_url(base, path_b), b'{"n": 3}', "application/json")[0] == 204
    status, claimed = call("POST", sub + "/claim", {"worker": "w2"})
    assert status == 200, claimed
    pending = {s["path"]: s["has_pending"] for s in claimed["streams"]}
    assert pending == {path_a: False, path_b: True}

    # Wake events went to the wake stream in another shard.
    deadline = time.monotonic() + scaled(10)
    events: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        data, _ = read_all(stream_url(base, wake_name))
        events = json.loads(data)
        if len(events) >= 2:
            break
        time.sleep(0.1)
    assert [e["subscription_id"] for e in events][:2] == [sub.rsplit("/", 1)[1]] * 2

    # A deleted stream is unlinked (its shard reports it gone).
    assert request("DELETE", stream_url(base, path_a))[0] == 204
    deadline = time.monotonic() + scaled(10)
    linked: set[str] = set()
    while time.monotonic() < deadline:
        status, view = call("GET", sub)
        linked = {s["path"] for s in view["streams"]}
        if path_a not in linked:
            break
        time.sleep(0.1)
    assert linked == {path_b}
    assert call("DELETE", sub)[0] == 204


# ---------------------------------------------------------------- the feed's pure parts


def _batch(
    shard: int, streams: list[tuple[str, int, int]], gone: list[str] = (), *, full: bool = False
) -> Any:  # type: ignore[assignment]
    return FeedBatch(shard, None, full, streams, list(gone))


def test_feed_table_turns_reports_into_created_appended_gone() -> None:
    table = FeedTable()
    assert table.apply(_batch(1, [("events/a", 7, 0), ("events/b", 8, 5)])) == [
        ("created", "events/a"),
        ("created", "events/b"),
    ]
    assert (table.tail("events/a"), table.tail("events/b"), table.tail("nope")) == (0, 5, None)
    # Tails only grow: a late, older report changes nothing; a newer one is an append.
    assert table.apply(_batch(1, [("events/b", 8, 3)])) == []
    assert table.apply(_batch(1, [("events/b", 8, 9)])) == [("appended", "events/b")]
    # Deleted and created again (a new uid): gone, then created.
    assert table.apply(_batch(1, [("events/a", 11, 2)])) == [("gone", "events/a"), ("created", "events/a")]
    # A full snapshot: what the shard no longer reports is gone; another shard's entries stay.
    table.apply(_batch(2, [("events/c", 1, 1)]))
    assert table.apply(_batch(1, [("events/b", 8, 9)], full=True)) == [("gone", "events/a")]
    assert sorted(table.paths()) == ["events/b", "events/c"]
    # A shard cannot report another shard's path gone.
    assert table.apply(_batch(1, [], ("events/c",))) == []
    assert table.tail("events/c") == 1


def test_remote_streams_link_wake_and_unlink_through_the_unchanged_state_machine() -> None:

    t0 = 1_700_000_000_000
    subs = SubscriptionState()
    state = StreamState([subs])
    table = FeedTable()

    def view() -> CombinedStreams:
        return CombinedStreams(StateStreams(state, t0), table)

    def feed(batch: Any) -> list[Any]:
        out: list[Any] = []
        for kind, path in table.apply(batch):
            for record in subs.on_remote_stream(kind, path, view(), t0):
                state.apply(record, None)
                out.append(record)
        return out

    state.apply(SigningKeyAdded("ds_k", b"p" * 32, b"s" * 32, b"t" * 32, t0), None)
    feed(_batch(3, [("events/old", 1, 4)]))
    records, _ = subs.decide_create("s", parse_config({"type": "pull-wake", "pattern": "events/*", "wake_stream": "w"}), "http://x", view(), t0)  # fmt: skip
    for record in records:
        state.apply(record, None)
    sub = subs.get("s")
    assert sub.links["events/old"].acked == 4  # backfilled at the reported tail
    created = feed(_batch(5, [("events/new", 2, 3)]))
    assert [type(r) for r in created] == [StreamsLinked, WakeIssued]
    assert dict(created[1].snapshot) == {"events/new": 3, "events/old": 4}
    assert feed(_batch(5, [("events/new", 2, 6)])) == []  # a wake is already out
    gone = feed(_batch(3, [], ("events/old",)))
    assert [type(r) for r in gone] == [StreamGone] and "events/old" not in sub.links
    assert feed(_batch(3, [("__ds/x", 9, 1)])) == []  # reserved paths never link


def test_retention_reported_by_another_shard_moves_links_past_it() -> None:
    """A shard reports a stream's first and retained offsets; a link retention passed moves (issue 18, defect 9)."""
    t0 = 1_700_000_000_000
    subs = SubscriptionState()
    state = StreamState([subs])
    table = FeedTable()

    def view() -> CombinedStreams:
        return CombinedStreams(StateStreams(state, t0), table)

    def feed(batch: Any) -> tuple[list[tuple[str, str]], list[Any]]:
        changes, out = table.apply(batch), []
        for kind, path in changes:
            for record in subs.on_remote_stream(kind, path, view(), t0):
                state.apply(record, None)
                out.append(record)
        return changes, out

    def batch(tail: int, retained: list[tuple[str, int, int]]) -> FeedBatch:
        return FeedBatch(4, None, False, [("events/r", 7, tail)], [], retained)

    state.apply(SigningKeyAdded("ds_k", b"p" * 32, b"s" * 32, b"t" * 32, t0), None)
    feed(batch(3, []))
    assert table.retained("events/r") == (0, 0) and table.retained("events/none") is None
    cfg = parse_config({"type": "pull-wake", "streams": ["events/r"], "wake_stream": "w"})
    for record in subs.decide_create("s", cfg, "http://x", view(), t0)[0]:
        state.apply(record, None)
    feed(batch(9, []))  # appended: a wake
    changes, records = feed(batch(9, [("events/r", 0, 6)]))
    assert changes == [("retained", "events/r")]
    assert [type(r) for r in records] == [LinksSkipped]
    assert [(s.path, s.acked, s.start, s.end) for s in records[0].skips] == [("events/r", 3, 3, 6)]
    link = subs.get("s").links["events/r"]
    assert (link.acked, link.skipped) == (6, (3, 6))
    # A report that is not newer changes nothing; a sender without the field reports no retention.
    assert feed(batch(9, [("events/r", 0, 5)])) == ([], [])
    assert feed(FeedBatch(4, None, False, [("events/r", 7, 9)], [])) == ([], [])


def test_the_feed_reports_a_write_again_once_it_is_durable() -> None:
    """A post built before a write is durable carries the old visible tail: the durable write marks it again.

    fb04ba4: nothing did, so a stream created empty and then appended to in another shard was reported at
    tail 0 and its append never (no wake until the stream's next change: a silent stall).
    """
    from tiered.cluster.features.sub_feed import FeedObserver
    from tiered.engine.streams.model import AppendRequest, CreateRequest

    state = StreamState([])
    marked: list[str | None] = []
    observer = FeedObserver(state, marked.append)
    t0 = 1_700_000_000_000
    created, _ = state.decide_create(
        DEFAULT_BUCKET, "events/a", CreateRequest("text/plain", None, None, None, False, b""), t0
    )
    for record in created:
        assert observer.on_durable(record) is None  # created empty: its creation report is exact
        state.apply(record, None)
    appended = state.decide_append(DEFAULT_BUCKET, "events/a", AppendRequest("text/plain", b"abc", False), t0)
    callback = observer.on_durable(appended)
    state.apply(appended, (1, 0))
    assert callback is not None and marked == []
    callback()
    assert marked == ["events/a"]
    reserved, _ = state.decide_create(
        DEFAULT_BUCKET, "__ds/x", CreateRequest("text/plain", None, None, None, False, b"x"), t0
    )
    assert observer.on_durable(reserved[0]) is None  # reserved paths are never reported
