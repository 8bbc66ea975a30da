"""The pure subscription state when retention passes a link's acked offset (issue 18, defect 9).

A real ``StreamState`` with the subscription extension, committed the way the
service commits (stream record, then ``on_stream_event``'s follow-ups), on a
virtual clock. The rules:

* a link whose acked offset retention passed moves to the stream's retained
  offset with a ``LinksSkipped`` record naming ``[acked, retained)`` (from
  the stream's first byte for a link that acked nothing yet): right after the
  retention record, and before any wake, claim, delivery or ack looks at it;
* the range (``skipped``) is in wake bodies, claims and GET until an ack
  reaches its end; skips with no ack between are one range;
* an ack inside the range (done before retention moved the cursor) is no
  error and changes nothing; one below it still regresses (409);
* a fork's inherited bytes (below its fork point) are no loss to a link that
  acked nothing yet, its own are;
* records are idempotent and survive snapshots and replay.
"""

from __future__ import annotations

from typing import Any

import pytest

from tiered.core.errors import TieredError
from tiered.core.ids import DEFAULT_BUCKET, format_offset
from tiered.engine.codec import decode_record, encode_record
from tiered.engine.streams.model import AppendRequest, CreateRequest, ForkRequest
from tiered.engine.streams.state import StreamState
from tiered.engine.subscriptions import views
from tiered.engine.subscriptions.config import WakeRequest, parse_config
from tiered.engine.subscriptions.records import (
    Acked,
    LinkSkip,
    LinksSkipped,
    SigningKeyAdded,
    WakeClaimed,
    WakeIssued,
)
from tiered.engine.subscriptions.state import StateStreams, SubscriptionState

T0 = 1_700_000_000_000
KEY = SigningKeyAdded("ds_test", b"p" * 32, b"s" * 32, b"t" * 32, T0)


class World:
    def __init__(self, *, follow: bool = True) -> None:
        self.subs = SubscriptionState()
        self.state = StreamState([self.subs])
        self.follow = follow  # False: as offline GC passes (and cluster shards reporting late) leave it
        self.log: list[bytes] = []
        self._pos = 8
        self.commit([KEY])

    def commit(self, records: list[Any]) -> list[Any]:
        out: list[Any] = []
        for r in records:
            body = encode_record(r)
            r = decode_record(body)
            before = self.state.streams.get(getattr(r, "uid", -1))
            location = None
            if getattr(r, "data", b""):
                location = (1, self._pos)
                self._pos += len(r.data) + 16
            self.state.apply(r, location)
            self.log.append(body)
            out.append(r)
            if type(r).__name__ == "RetentionAdvanced" and not self.follow:
                continue
            out += self.commit(self.subs.on_stream_event(r, before, self.state))
        return out

    def streams(self) -> StateStreams:
        return StateStreams(self.state, T0)

    def stream(self, path: str, data: bytes, fork: tuple[str, int] | None = None) -> list[Any]:
        spec = None
        if fork is not None:
            source = self.state.find(DEFAULT_BUCKET, fork[0])
            assert source is not None
            spec = ForkRequest(source.uid, fork[1], f"{fork[0]}@{fork[1]}")
        req = CreateRequest(None if fork else "text/plain", None, None, None, False, data, spec)
        records, _ = self.state.decide_create(DEFAULT_BUCKET, path, req, T0)
        return self.commit(records)

    def append(self, path: str, data: bytes) -> list[Any]:
        req = AppendRequest("text/plain", data, False)
        return self.commit([self.state.decide_append(DEFAULT_BUCKET, path, req, T0)])

    def retain(self, path: str, offset: int) -> list[Any]:
        return self.commit(self.state.decide_retain(DEFAULT_BUCKET, path, offset, T0))

    def subscribe(self, sub_id: str, body: dict[str, Any]) -> None:
        records, _ = self.subs.decide_create(sub_id, parse_config(body), "http://srv", self.streams(), T0)
        self.commit(records)

    def claim(self, sub_id: str) -> dict[str, Any]:
        self.commit(self.subs.decide_claim(sub_id, "w1", self.streams(), T0))
        sub = self.subs.get(sub_id)
        assert sub.wake is not None
        return {"streams": views.stream_infos(self.subs, sub, self.streams()), "token": self.token(sub_id)}

    def token(self, sub_id: str) -> str:
        return self.subs.token_for(self.subs.get(sub_id), T0)

    def ack(self, sub_id: str, acks: dict[str, int], *, done: bool = False) -> list[Any]:
        sub = self.subs.get(sub_id)
        assert sub.wake is not None
        req = WakeRequest(sub.wake.wake_id, sub.generation, tuple(acks.items()), done)
        records, _ = self.subs.decide_ack(sub_id, self.token(sub_id), req, self.streams(), T0, pull_only=True)
        return self.commit(records)


def pull(**extra: Any) -> dict[str, Any]:
    return {"type": "pull-wake", "wake_stream": "wake/pool", **extra}


def gap(start: int, end: int) -> dict[str, Any]:
    return {"from": format_offset(start), "to": format_offset(end), "bytes": end - start}


def skips(records: list[Any]) -> list[tuple[str, int, int, int]]:
    return [
        (s.path, s.acked, s.start, s.end) for r in records if isinstance(r, LinksSkipped) for s in r.skips
    ]


def test_retention_moves_the_acked_offset_and_every_view_reports_it() -> None:
    w = World()
    w.stream("wake/pool", b"")
    w.stream("events/a", b"abc")
    w.subscribe("s", pull(streams=["events/a"]))  # linked at the tail: 3
    w.append("events/a", b"defgh")  # tail 8: a wake
    moved = w.retain("events/a", 6)
    assert skips(moved) == [("events/a", 3, 3, 6)]
    link = w.subs.get("s").links["events/a"]
    assert (link.acked, link.skipped) == (6, (3, 6))
    described = views.describe(w.subs, w.subs.get("s"), "http://srv/jwks")["streams"]
    assert described == [
        {"path": "events/a", "link_type": "explicit", "acked_offset": format_offset(6), "skipped": gap(3, 6)}
    ]
    claimed = w.claim("s")
    assert claimed["streams"] == [
        {
            "path": "events/a",
            "link_type": "explicit",
            "acked_offset": format_offset(6),
            "tail_offset": format_offset(8),
            "has_pending": True,
            "skipped": gap(3, 6),
        }
    ]
    # Retention again before an ack reaching past it: one range.
    assert skips(w.retain("events/a", 7)) == [("events/a", 6, 6, 7)]
    assert w.subs.get("s").links["events/a"].skipped == (3, 7)
    # An ack inside the range (work done before retention) is no error and changes nothing ...
    records = w.ack("s", {"events/a": 5})
    assert [type(r) for r in records] == [Acked] and records[0].acks == ()
    # ... one below it regresses, as always.
    with pytest.raises(TieredError) as info:
        w.ack("s", {"events/a": 2})
    assert info.value.code == "INVALID_OFFSET"
    # Acking past the end clears the report.
    w.ack("s", {"events/a": 8}, done=True)
    link = w.subs.get("s").links["events/a"]
    assert (link.acked, link.skipped) == (8, None)
    assert w.subs.decide_skips(["s"], w.streams(), T0) == []


def test_a_link_that_acked_nothing_skips_from_the_streams_first_byte() -> None:
    w = World()
    w.stream("wake/pool", b"")
    w.subscribe("s", pull(pattern="events/*"))
    created = w.stream("events/new", b"0123456789")  # linked before its first byte, woken
    assert [type(r).__name__ for r in created][-2:] == ["StreamsLinked", "WakeIssued"]
    assert skips(w.retain("events/new", 4)) == [("events/new", -1, 0, 4)]
    claimed = w.claim("s")
    assert claimed["streams"][0]["acked_offset"] == format_offset(4)
    assert claimed["streams"][0]["skipped"] == gap(0, 4)


def test_a_forks_inherited_bytes_are_no_loss() -> None:
    w = World()
    w.stream("wake/pool", b"")
    w.stream("src", b"0123456789")
    w.retain("src", 3)
    w.subscribe("s", pull(pattern="forks/*"))
    w.stream("forks/f", b"", fork=("src", 8))  # inherits [3, 8): readable, retained from 3
    w.append("forks/f", b"xy")
    assert w.subs.get("s").links["forks/f"].acked == -1
    assert w.subs.decide_skips(["s"], w.streams(), T0) == []
    # Retention among the inherited bytes is no loss either; of the fork's own bytes (from 8 on), it is.
    assert skips(w.retain("forks/f", 6)) == []
    assert skips(w.retain("forks/f", 9)) == [("forks/f", -1, 8, 9)]


def test_without_the_follow_up_claims_acks_and_deliveries_catch_it() -> None:
    """Offline GC passes and other shards' late reports leave it to the next decision that looks."""
    w = World(follow=False)
    w.stream("wake/pool", b"")
    w.stream("events/a", b"abc")
    w.subscribe("s", pull(streams=["events/a"]))
    w.append("events/a", b"defgh")
    w.retain("events/a", 5)
    assert w.subs.get("s").links["events/a"].acked == 3  # not moved yet
    claimed = w.commit(w.subs.decide_claim("s", "w1", w.streams(), T0))
    assert [type(r) for r in claimed] == [LinksSkipped, WakeClaimed]
    assert skips(claimed) == [("events/a", 3, 3, 5)]
    w.retain("events/a", 7)
    # An ack is applied first; what it leaves behind the retained offset is skipped.
    records = w.ack("s", {"events/a": 6})
    assert [type(r) for r in records] == [Acked, LinksSkipped] and skips(records) == [("events/a", 6, 6, 7)]
    assert w.subs.get("s").links["events/a"].skipped == (6, 7)  # an ack moved it between: a new range
    # Webhooks: the shell asks decide_skips right before a delivery; done acks the snapshot after the move.
    w2 = World(follow=False)
    w2.stream("events/b", b"abc")
    w2.subscribe(
        "h", {"type": "webhook", "streams": ["events/b"], "webhook": {"url": "https://h.example.com/"}}
    )
    issued = w2.append("events/b", b"defgh")
    assert [type(r) for r in issued][-1] is WakeIssued
    w2.retain("events/b", 4)
    assert skips(w2.commit(w2.subs.decide_skips(["h"], w2.streams(), T0))) == [("events/b", 3, 3, 4)]
    sub = w2.subs.get("h")
    assert sub.wake is not None
    body = views.webhook_body(w2.subs, sub, "http://srv/cb", "tok")
    assert body["streams"][0]["skipped"] == gap(3, 4)
    done = w2.commit(w2.subs.decide_delivered("h", sub.wake.wake_id, True, w2.streams(), T0))
    assert any(isinstance(r, Acked) and r.acks == (("events/b", 8),) for r in done)
    assert w2.subs.get("h").links["events/b"].skipped is None


def test_skip_records_are_idempotent_and_survive_snapshots_and_replay() -> None:
    w = World()
    w.stream("wake/pool", b"")
    w.stream("events/a", b"abc")
    w.subscribe("s", pull(streams=["events/a"]))
    w.append("events/a", b"defgh")
    (record,) = [r for r in w.retain("events/a", 6) if isinstance(r, LinksSkipped)]
    before = w.subs.snapshot()
    w.subs.apply(record)  # replayed: the acked offset is no longer the one it moved from
    w.subs.apply(LinksSkipped("s", T0, (LinkSkip("events/a", 3, 3, 8),)))  # stale
    w.subs.apply(LinksSkipped("gone", T0, (LinkSkip("events/a", 6, 6, 8),)))  # no such subscription
    assert w.subs.snapshot() == before
    restored = SubscriptionState()
    restored.restore(before)
    assert restored.get("s").links["events/a"].skipped == (3, 6)
    replayed = SubscriptionState()
    state = StreamState([replayed])
    for body in w.log:
        r = decode_record(body)
        state.apply(r, (1, 0) if getattr(r, "data", b"") else None)
    assert replayed.snapshot() == before
