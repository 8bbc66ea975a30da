"""Retention passing a consumer group's or a subscription's cursor: moved and reported, never a silent stall.

Black-box against ``tiered serve`` (issue 18, defect 9). When retention
releases data a group has not committed, or a subscription link has not
acked, the cursor moves to the stream's retained offset and the skipped
range shows up in three places: a field (``skipped``) in what the member or
worker is handed next, a metric (``tiered_group_skipped_bytes_total``,
``tiered_subscription_skipped_bytes_total`` and their ``_ranges_``
counterparts) and a warning in the server's log naming the group or
subscription, the stream and the range.

The same tests run against a single-node cluster of 4 shards
(``tests/support/deployments.py``). Groups live in the shard of
``__groups/<name>`` and subscriptions in the one of ``__ds``; the streams are in
whichever shard their names hash to. A stream's retention in another shard
reaches a group through the directory's listing (its retained offset, at the
group's next sweep) and the subscriptions through the feed (a ``retained``
change): the cursor moves and the range is reported all the same.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import deployments
from tests.support.http_helpers import append, create, request, stream_url, unique
from tests.support.metrics_helpers import scrape
from tests.support.server_process import ServerProcess
from tests.support.subscription_helpers import WebhookReceiver, call, wait_until
from tiered.core.ids import format_offset
from tiered_client.groups import Batch, GroupConsumer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(
    scope="module",
    params=(deployments.SINGLE_NODE, pytest.param(deployments.CLUSTER_NODE, marks=pytest.mark.timeout(180))),
)
def srv(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    yield from deployments.module_server(request, "skips", "--webhook-allow-loopback", "true")


def retain(srv: ServerProcess, path: str, offset: int) -> None:
    status, headers, body = request(
        "POST",
        f"{srv.url}/v1/admin/retain/default/{path}",
        {"Content-Type": "application/json"},
        json.dumps({"offset": format_offset(offset)}).encode(),
    )
    assert (status, headers.get("Stream-Retained-Offset")) == (204, format_offset(offset)), body


def make(srv: ServerProcess, path: str, data: bytes) -> None:
    status, _, body = create(stream_url(srv.url, path), "text/plain", data)
    assert status == 201, body


def add(srv: ServerProcess, path: str, data: bytes) -> None:
    status, _, body = append(stream_url(srv.url, path), data, "text/plain")
    assert status == 204, body


def server_log(srv: ServerProcess) -> str:
    return srv.log_path.read_text(errors="replace")


def skipped(start: int, end: int) -> dict[str, Any]:
    return {"from": format_offset(start), "to": format_offset(end), "bytes": end - start}


def counters(srv: ServerProcess, kind: str) -> tuple[float, float]:
    """(bytes, ranges) skipped, summed over the engines (a cluster node labels each shard's)."""
    got = scrape(srv)

    def total(name: str) -> float:
        found = [v for k, v in got.items() if k == name or k.startswith(name + "{")]
        assert found, name
        return sum(found)

    return total(f"tiered_{kind}_skipped_bytes_total"), total(f"tiered_{kind}_skipped_ranges_total")


# --------------------------------------------------------------------------- consumer groups


def test_group_consumer_gets_the_retained_data_after_retention_passed_its_cursor(srv: ServerProcess) -> None:
    """The issue's reproduction: a trimmed group used to get nothing while a control group got its batch."""
    trimmed, control = unique("trim"), unique("ctl")
    old = b"old-1\nold-2\nold-3\n"
    make(srv, trimmed, old)
    make(srv, control, old)
    g_trim, g_ctl = unique("gtrim"), unique("gctl")
    for g, path in ((g_trim, trimmed), (g_ctl, control)):
        status, body = call("PUT", f"{srv.url}/v1/groups/{g}", {"streams": [path]})[:2]
        assert status == 201, body
    retain(srv, trimmed, len(old))  # retention passes the trimmed group's cursor (0, nothing committed)
    add(srv, trimmed, b"new\n")
    add(srv, control, b"new\n")

    async def first_batch(group: str) -> Batch:
        async with GroupConsumer(srv.url, group, "worker-1", wait_ms=500) as consumer:
            async with asyncio.timeout(10):  # fb04ba4: the trimmed group never got a batch
                batch = await consumer.__anext__()
                assert consumer.commit(batch)
                await consumer.flush()
                return batch

    async def both() -> tuple[Batch, Batch]:
        return await asyncio.gather(first_batch(g_trim), first_batch(g_ctl))

    got_trim, got_ctl = asyncio.run(both())
    assert (got_ctl.data, got_ctl.offset, getattr(got_ctl, "skipped", None)) == (
        old + b"new\n",
        format_offset(0),
        None,
    )
    assert got_trim.data == b"new\n"
    assert got_trim.offset == format_offset(len(old))
    assert got_trim.next_offset == format_offset(len(old) + 4)
    s = got_trim.skipped
    assert (s.stream, s.from_offset, s.to_offset, s.bytes) == (
        trimmed,
        format_offset(0),
        format_offset(len(old)),
        len(old),
    )
    # The group's cursor is past what the consumer processed and committed.
    status, view = call("GET", f"{srv.url}/v1/groups/{g_trim}")[:2]
    assert status == 200 and view["targets"][0]["cursor"] == format_offset(len(old) + 4)
    assert "skipped" not in view["targets"][0]  # reported and committed past: nothing left to report


def test_group_cursor_behind_retention_moves_with_the_skipped_range_reported(srv: ServerProcess) -> None:
    path = unique("gs")
    make(srv, path, b"0123456789")
    g = unique("g")
    assert call("PUT", f"{srv.url}/v1/groups/{g}", {"streams": [path]})[0] == 201
    status, view, _ = call("POST", f"{srv.url}/v1/groups/{g}/join", {"member": "m1", "join_id": "j1"})
    assert status == 200
    a = view["assignments"][0]
    assert (a["cursor"], "skipped" in a) == (format_offset(0), False)
    member = {"member": "m1", "incarnation": view["incarnation"], "generation": view["generation"]}
    commit = {"stream": path, "fence": a["fence"], "offset": format_offset(4)}
    status, view, _ = call("POST", f"{srv.url}/v1/groups/{g}/heartbeat", {**member, "commits": [commit]})
    assert status == 200 and view["rejected"] == []
    bytes_before, ranges_before = counters(srv, "group")

    retain(srv, path, 8)  # the group committed 4: bytes 4..8 were never processed and are gone now

    # Moved as retention was applied (a cluster's group in another shard: at its next sweep).
    def moved() -> dict[str, Any] | None:
        status, described, _ = call("GET", f"{srv.url}/v1/groups/{g}")
        assert status == 200
        row = described["targets"][0]
        return row if row["cursor"] != format_offset(4) else None

    row = wait_until(moved)
    assert (row["cursor"], row["tail"], row["skipped"]) == (
        format_offset(8),
        format_offset(10),
        skipped(4, 8),
    )
    status, view, _ = call("POST", f"{srv.url}/v1/groups/{g}/heartbeat", member)
    assert status == 200
    assert view["assignments"] == [
        {
            "stream": path,
            "fence": a["fence"],
            "cursor": format_offset(8),
            "revoked": False,
            "skipped": skipped(4, 8),
        }
    ]
    assert counters(srv, "group") == (bytes_before + 4, ranges_before + 1)
    line = (
        f"group {g!r}: retention passed its cursor on stream {path!r} (bucket 'default'): "
        f"moved from {format_offset(4)} to {format_offset(8)}, 4 bytes skipped"
    )
    wait_until(lambda: line in server_log(srv))

    # A read from the old cursor is 410 naming the retained offset; from the new one it serves the rest.
    status, headers, _ = request("GET", stream_url(srv.url, path) + f"?offset={format_offset(4)}")
    assert (status, headers["Stream-Next-Offset"]) == (410, format_offset(8))
    status, _, data = request("GET", stream_url(srv.url, path) + f"?offset={format_offset(8)}")
    assert (status, data) == (200, b"89")
    # A late commit below the new cursor changes nothing; committing past it clears the report.
    late = {**commit, "offset": format_offset(6)}
    status, view, _ = call("POST", f"{srv.url}/v1/groups/{g}/heartbeat", {**member, "commits": [late]})
    assert status == 200 and view["assignments"][0]["cursor"] == format_offset(8)
    assert view["assignments"][0]["skipped"] == skipped(4, 8)
    done = {**commit, "offset": format_offset(10)}
    status, view, _ = call("POST", f"{srv.url}/v1/groups/{g}/heartbeat", {**member, "commits": [done]})
    assert status == 200
    assert view["assignments"] == [
        {"stream": path, "fence": a["fence"], "cursor": format_offset(10), "revoked": False}
    ]
    assert counters(srv, "group") == (bytes_before + 4, ranges_before + 1)


# --------------------------------------------------------------------------- subscriptions


def test_pull_wake_link_behind_retention_moves_with_the_skipped_range_reported(srv: ServerProcess) -> None:
    path, wakes, sub = unique("ev"), unique("wakes"), unique("sub")
    assert create(stream_url(srv.url, wakes), "application/json")[0] == 201
    base = f"{srv.url}/v1/stream/__ds/subscriptions/{sub}"
    # Linked before the stream exists (before its first byte, in every mode: no race with a cluster's feed).
    status, body, _ = call("PUT", base, {"type": "pull-wake", "streams": [path], "wake_stream": wakes})
    assert status == 201, body
    make(srv, path, b"")
    add(srv, path, b"abc")
    # (A cluster's subscriptions' shard may hear of a brand-new stream of another shard a moment later.)
    status, claimed, _ = wait_until(
        lambda: (got := call("POST", base + "/claim", {"worker": "w0"}))[0] == 200 and got
    )
    wake = {"wake_id": claimed["wake_id"], "generation": claimed["generation"]}
    ack = {**wake, "acks": [{"stream": path, "offset": format_offset(3)}], "done": True}
    assert call("POST", base + "/ack", ack, token=claimed["token"])[:2] == (
        200,
        {"ok": True, "next_wake": False},
    )
    add(srv, path, b"defgh")  # tail 8: pending work from 3
    bytes_before, ranges_before = counters(srv, "subscription")

    retain(srv, path, 6)  # acked 3: bytes 3..6 were never processed and are gone now

    # Moved as retention was applied (a cluster's other shard reports it through the feed first).
    def moved() -> dict[str, Any] | None:
        status, described, _ = call("GET", base)
        assert status == 200
        return described if described["streams"][0]["acked_offset"] != format_offset(3) else None

    described = wait_until(moved)
    assert described["streams"] == [
        {
            "path": path,
            "link_type": "explicit",
            "acked_offset": format_offset(6),
            "skipped": skipped(3, 6),
        }
    ]
    status, claimed, _ = call("POST", base + "/claim", {"worker": "w1"})
    assert status == 200, claimed
    assert claimed["streams"] == [
        {
            "path": path,
            "link_type": "explicit",
            "acked_offset": format_offset(6),
            "tail_offset": format_offset(8),
            "has_pending": True,
            "skipped": skipped(3, 6),
        }
    ]
    assert counters(srv, "subscription") == (bytes_before + 3, ranges_before + 1)
    line = (
        f"subscription {sub!r}: retention passed its acked offset on stream {path!r}: "
        f"moved from {format_offset(3)} to {format_offset(6)}, 3 bytes skipped"
    )
    wait_until(lambda: line in server_log(srv))

    # An ack below the moved cursor (work done before retention) is no error; acking past it clears the report.
    wake = {"wake_id": claimed["wake_id"], "generation": claimed["generation"]}
    status, answer, _ = call(
        "POST",
        base + "/ack",
        {**wake, "acks": [{"stream": path, "offset": format_offset(5)}]},
        token=claimed["token"],
    )
    assert (status, answer) == (200, {"ok": True, "next_wake": False})
    status, answer, _ = call(
        "POST",
        base + "/ack",
        {**wake, "acks": [{"stream": path, "offset": format_offset(8)}], "done": True},
        token=claimed["token"],
    )
    assert (status, answer) == (200, {"ok": True, "next_wake": False})
    status, described, _ = call("GET", base)
    assert described["streams"] == [{"path": path, "link_type": "explicit", "acked_offset": format_offset(8)}]
    assert counters(srv, "subscription") == (bytes_before + 3, ranges_before + 1)


def test_webhook_wake_reports_the_skipped_range(srv: ServerProcess) -> None:
    """A link that acked nothing yet: the range starts at the stream's first byte."""
    path, sub = unique("hook"), unique("hsub")
    base = f"{srv.url}/v1/stream/__ds/subscriptions/{sub}"
    moved = threading.Event()  # deliveries fail until retention moved the link: then one is accepted

    def respond(index: int, body: dict[str, Any]) -> tuple[int, Any]:
        return (200, {"done": True}) if moved.is_set() else (503, {})

    with WebhookReceiver(respond) as receiver:
        status, body, _ = call(
            "PUT", base, {"type": "webhook", "streams": [path], "webhook": {"url": receiver.url}}
        )
        assert status == 201, body
        make(srv, path, b"")  # linked before its first byte (-1)
        add(srv, path, b"abcdefgh")
        first = receiver.wait_for(1, timeout=30)  # (a cluster's first wake for a new stream can take seconds)
        assert [s.get("skipped") for s in first.body["streams"]] == [None]
        retain(srv, path, 7)
        wait_until(lambda: call("GET", base)[1]["streams"][0]["acked_offset"] == format_offset(7))
        moved.set()
        seen = len(receiver.received)
        accepted = receiver.wait_for(seen + 1, timeout=30)  # the next retry (1 s doubling, +-20%)
        assert accepted.body["streams"] == [
            {
                "path": path,
                "link_type": "explicit",
                "acked_offset": format_offset(7),
                "tail_offset": format_offset(8),
                "has_pending": True,
                "skipped": skipped(0, 7),
            }
        ]

        def settled() -> bool:
            described = call("GET", base)[1]
            return described["streams"][0]["acked_offset"] == format_offset(8)

        wait_until(settled, timeout=20)
        status, described, _ = call("GET", base)
        assert described["streams"] == [
            {"path": path, "link_type": "explicit", "acked_offset": format_offset(8)}
        ]
