"""The pure stream state machine: decide -> records -> apply, and plan_read.

No disk, no clock, no HTTP: time is passed in as ``now_ms`` and data
locations are ``(segment, position)`` pairs handed out by a fake disk, a dict
from location to the bytes "written" there. Reads go through ``plan_read`` and
that dict, so a slice that points anywhere but inside one written record
fails loudly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from tests.support.error_helpers import http_status, protocol_headers
from tests.support.state_fingerprint import fingerprint
from tiered.core.content import DEFAULT_CONTENT_TYPE, media_type
from tiered.core.errors import ErrorCode
from tiered.core.errors import TieredError as StreamError
from tiered.core.ids import DEFAULT_BUCKET, format_offset
from tiered.engine.codec import Record, decode_record, encode_record
from tiered.engine.snapshot import decode_snapshot, encode_snapshot
from tiered.engine.streams import lifecycle
from tiered.engine.streams.model import (
    AppendRequest,
    CreateRequest,
    Duplicate,
    ForkCopy,
    ForkRequest,
    HotSlice,
    Stream,
)
from tiered.engine.streams.records import (
    Appended,
    BucketCreated,
    StreamCreated,
    StreamDeleted,
    StreamExpired,
    StreamTouched,
)
from tiered.engine.streams.state import StreamState
from tiered.hot.log import LogPosition

B = DEFAULT_BUCKET

# --------------------------------------------------------------------------- harness


class FakeDisk:
    """Locations handed out for record payloads, and reads of them."""

    def __init__(self, segment_span: int = 48) -> None:
        self.blobs: dict[tuple[int, int], bytes] = {}
        self.seg = 1
        self.pos = 8
        self.segment_span = segment_span

    def place(self, data: bytes) -> tuple[int, int]:
        # Irregular gaps between payloads, so an off-by-some position misses.
        self.pos += 5 + (len(self.blobs) * 7) % 11
        loc = (self.seg, self.pos)
        self.blobs[loc] = bytes(data)
        self.pos += len(data)
        if self.pos > self.segment_span:
            self.seg += 1
            self.pos = 8
        return loc

    def read(self, sl: HotSlice) -> bytes:
        assert sl.length > 0, f"empty slice {sl}"
        hits = [
            (pos, data)
            for (seg, pos), data in self.blobs.items()
            if seg == sl.segment and pos <= sl.position and sl.position + sl.length <= pos + len(data)
        ]
        assert len(hits) == 1, f"slice {sl} is not inside exactly one written payload"
        pos, data = hits[0]
        return data[sl.position - pos : sl.position - pos + sl.length]


def read_through(state: StreamState, disk: FakeDisk, s: Stream, start: int, end: int) -> bytes:
    return b"".join(disk.read(sl) for sl in state.plan_read(s, start, end))


class Harness:
    """A StreamState plus a fake disk and the journal of applied records."""

    def __init__(self) -> None:
        self.state = StreamState()
        self.disk = FakeDisk()
        self.journal: list[tuple[Record, tuple[int, int] | None]] = []

    # -- plumbing
    def commit(self, records: list[Record]) -> None:
        for r in records:
            data = getattr(r, "data", b"")
            loc = self.disk.place(data) if data else None
            self.state.apply(r, loc)
            self.journal.append((r, loc))

    def stream(self, path: str, bucket: str = B) -> Stream:
        s = self.state.find(bucket, path)
        assert s is not None, path
        return s

    def read(self, target: str | Stream, start: int = 0, end: int | None = None) -> bytes:
        s = self.stream(target) if isinstance(target, str) else target
        return read_through(self.state, self.disk, s, start, s.tail if end is None else end)

    def replay(self) -> StreamState:
        fresh = StreamState()
        for r, loc in self.journal:
            fresh.apply(decode_record(encode_record(r)), loc)
        return fresh

    # -- requests
    def decide_create(
        self,
        path: str,
        *,
        now: int = 0,
        bucket: str = B,
        content_type: str | None = None,
        ttl_s: int | None = None,
        expires_at_ms: int | None = None,
        closed: bool = False,
        data: bytes = b"",
        fork: ForkRequest | None = None,
    ) -> tuple[list[Record], Stream | None]:
        expires_at = None if expires_at_ms is None else f"at:{expires_at_ms}"
        req = CreateRequest(content_type, ttl_s, expires_at, expires_at_ms, closed, data, fork)
        return self.state.decide_create(bucket, path, req, now)

    def create(self, path: str, **kw: Any) -> list[Record]:
        records, existing = self.decide_create(path, **kw)
        self.commit(records)
        return records

    def append(
        self,
        path: str,
        data: bytes = b"",
        *,
        now: int = 0,
        bucket: str = B,
        close: bool = False,
        content_type: str | None = None,
        producer: str | None = None,
        epoch: int = 0,
        seq: int = 0,
        stream_seq: str | None = None,
    ) -> Appended | Duplicate:
        req = AppendRequest(content_type, data, close, producer, epoch, seq, stream_seq)
        decided = self.state.decide_append(bucket, path, req, now)
        if isinstance(decided, Appended):
            self.commit([decided])
        return decided

    def delete(self, path: str, *, now: int = 0, bucket: str = B) -> StreamDeleted:
        record = self.state.decide_delete(bucket, path, now)
        self.commit([record])
        return record

    def fork_request(
        self, src: str, offset: int | None = None, *, now: int = 0, spec: str | None = None
    ) -> ForkRequest:
        s = self.state.lookup(B, src, now)
        off = s.tail if offset is None else offset
        return ForkRequest(s.uid, off, spec or f"{src}@{off}")


def status_of(fn: Any, *args: Any) -> int:
    with pytest.raises(StreamError) as exc:
        fn(*args)
    return http_status(exc.value)


# --------------------------------------------------------------------------- create


def test_create_emits_a_record_and_applies() -> None:
    h = Harness()
    records, existing = h.decide_create("orders", now=100, content_type="text/plain", data=b"hello")
    assert existing is None
    assert len(records) == 1
    rec = records[0]
    assert isinstance(rec, StreamCreated)
    assert (rec.uid, rec.bucket, rec.path, rec.content_type, rec.ts_ms) == (1, B, "orders", "text/plain", 100)
    assert (rec.fork_source, rec.fork_offset, rec.fork_spec, rec.closed, rec.data) == (
        None,
        0,
        None,
        False,
        b"hello",
    )
    # Deciding changes nothing until the record is applied.
    assert h.state.find(B, "orders") is None
    h.commit(records)
    s = h.stream("orders")
    assert (s.uid, s.tail, s.closed, s.created_ms, s.last_access_ms) == (1, 5, False, 100, 100)
    assert h.read("orders") == b"hello"
    assert h.state.next_uid == 2
    assert h.state.lookup(B, "orders", 100) is s


def test_create_defaults_to_octet_stream_and_empty() -> None:
    h = Harness()
    (rec,) = h.create("s")
    assert isinstance(rec, StreamCreated)
    assert rec.content_type == DEFAULT_CONTENT_TYPE
    assert h.stream("s").tail == 0
    assert h.state.plan_read(h.stream("s"), 0, 0) == []
    assert h.state.hot_bytes == 0


def test_uids_are_never_reused() -> None:
    h = Harness()
    h.create("a")
    h.create("b")
    h.delete("b")
    (rec,) = h.create("c")
    assert isinstance(rec, StreamCreated) and rec.uid == 3
    h.delete("a")
    h.delete("c")
    (rec,) = h.create("a")
    assert isinstance(rec, StreamCreated) and rec.uid == 4


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({}, {}),
        ({"content_type": "text/plain"}, {"content_type": "text/plain"}),
        ({"content_type": "text/plain"}, {"content_type": "TEXT/PLAIN; charset=utf-8"}),
        ({}, {"content_type": "application/octet-stream"}),
        ({"ttl_s": 60}, {"ttl_s": 60}),
        ({"expires_at_ms": 10**12}, {"expires_at_ms": 10**12}),
        ({"closed": True}, {"closed": True}),
        ({"data": b"abc"}, {"data": b"something else"}),  # the body is not configuration
    ],
)
def test_create_idempotent_match(first: dict[str, Any], second: dict[str, Any]) -> None:
    h = Harness()
    h.create("s", **first)
    before = fingerprint(h.state)
    records, existing = h.decide_create("s", now=1, **second)
    assert records == []
    assert existing is h.stream("s")
    assert fingerprint(h.state) == before


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"content_type": "text/plain"}, {"content_type": "application/json"}),
        ({"content_type": "text/plain"}, {}),  # no Content-Type means octet-stream
        ({}, {"content_type": "text/plain"}),
        ({"ttl_s": 60}, {"ttl_s": 61}),
        ({"ttl_s": 60}, {}),
        ({}, {"ttl_s": 60}),
        ({"expires_at_ms": 10**12}, {"expires_at_ms": 10**12 + 1}),
        ({"expires_at_ms": 10**12}, {"ttl_s": 60}),
        ({"closed": True}, {}),
        ({}, {"closed": True}),
    ],
)
def test_create_config_mismatch_is_409(first: dict[str, Any], second: dict[str, Any]) -> None:
    h = Harness()
    h.create("s", **first)
    with pytest.raises(StreamError) as exc:
        h.decide_create("s", now=1, **second)
    assert http_status(exc.value) == 409


def test_create_matches_against_current_closed_state() -> None:
    h = Harness()
    h.create("s")
    h.append("s", b"x", close=True)
    assert status_of(h.decide_create, "s") == 409
    records, existing = h.decide_create("s", closed=True)
    assert records == [] and existing is h.stream("s")


def test_create_a_plain_stream_over_a_fork_is_409() -> None:
    h = Harness()
    h.create("src", data=b"abc")
    h.create("f", fork=h.fork_request("src", 1))
    assert status_of(h.decide_create, "f") == 409


# --------------------------------------------------------------------------- buckets


def test_buckets() -> None:
    h = Harness()
    assert h.state.decide_bucket(B, 0) == []
    with pytest.raises(StreamError) as exc:
        h.decide_create("s", bucket="tenant-a")
    assert http_status(exc.value) == 404 and "tenant-a" in exc.value.message
    records = h.state.decide_bucket("tenant-a", 55)
    assert records == [BucketCreated(name="tenant-a", ts_ms=55)]
    h.commit(records)
    assert h.state.buckets == {B: 0, "tenant-a": 55}
    assert h.state.decide_bucket("tenant-a", 99) == []
    # Applying a duplicate bucket record (replay) keeps the first timestamp.
    h.state.apply(BucketCreated(name="tenant-a", ts_ms=77))
    assert h.state.buckets["tenant-a"] == 55
    # The same path in two buckets is two streams.
    h.create("s", data=b"default!")
    h.create("s", bucket="tenant-a", data=b"tenant")
    a, b = h.stream("s"), h.stream("s", "tenant-a")
    assert a.uid != b.uid
    assert h.read(a) == b"default!" and h.read(b) == b"tenant"
    h.delete("s", bucket="tenant-a")
    assert h.state.find("tenant-a", "s") is None and h.state.find(B, "s") is a


# --------------------------------------------------------------------------- appends


def test_appends_advance_the_tail_and_read_back() -> None:
    h = Harness()
    h.create("s", data=b"ab")
    r1 = h.append("s", b"cde", now=5)
    assert isinstance(r1, Appended)
    assert (r1.uid, r1.offset, r1.ts_ms, r1.close, r1.data) == (1, 2, 5, False, b"cde")
    r2 = h.append("s", b"f", now=6)
    assert isinstance(r2, Appended) and r2.offset == 5
    s = h.stream("s")
    assert s.tail == 6 and len(s.chunks) == 3
    assert h.read("s") == b"abcdef"
    for a in range(7):
        for b in range(a, 7):
            assert h.read("s", a, b) == b"abcdef"[a:b]
    assert h.state.hot_bytes == 6
    assert s.last_access_ms == 6


def test_append_to_missing_stream_is_404() -> None:
    h = Harness()
    assert status_of(h.append, "nope", b"x") == 404
    assert status_of(h.state.decide_delete, B, "nope", 0) == 404
    with pytest.raises(StreamError) as exc:
        h.state.lookup(B, "nope", 0)
    assert http_status(exc.value) == 404


def test_append_content_type_must_match() -> None:
    h = Harness()
    h.create("s", content_type="application/json")
    with pytest.raises(StreamError) as exc:
        h.append("s", b"1\n", content_type="text/plain")
    assert http_status(exc.value) == 409
    assert isinstance(h.append("s", b"1\n", content_type="Application/JSON; charset=utf-8"), Appended)
    assert isinstance(h.append("s", b"2\n"), Appended)  # no Content-Type: accepted
    # A close-only request carries no body, so its Content-Type is not checked.
    assert isinstance(h.append("s", content_type="text/plain", close=True), Appended)
    assert h.stream("s").json


def test_apply_refuses_data_without_a_location() -> None:
    st_ = StreamState()
    with pytest.raises(ValueError):
        st_.apply(
            StreamCreated(1, B, "s", DEFAULT_CONTENT_TYPE, None, None, None, False, 0, None, 0, None, b"x")
        )
    st_.apply(StreamCreated(1, B, "s", DEFAULT_CONTENT_TYPE, None, None, None, False, 0, None, 0, None, b""))
    with pytest.raises(ValueError):
        st_.apply(Appended(1, 0, 0, None, 0, 0, None, False, b"x"))


# --------------------------------------------------------------------------- close


def test_close_with_data_then_close_only_is_a_duplicate() -> None:
    h = Harness()
    h.create("s", data=b"a")
    rec = h.append("s", b"bc", close=True, now=3)
    assert isinstance(rec, Appended) and rec.close
    s = h.stream("s")
    assert s.closed and s.tail == 3 and s.closed_by is None
    journal_len = len(h.journal)
    dup = h.append("s", close=True)
    assert isinstance(dup, Duplicate)
    assert (dup.stream, dup.epoch, dup.seq) == (s, None, None)
    assert len(h.journal) == journal_len


def test_close_only_append() -> None:
    h = Harness()
    h.create("s", data=b"abc")
    rec = h.append("s", close=True)
    assert isinstance(rec, Appended) and rec.data == b"" and rec.offset == 3
    s = h.stream("s")
    assert s.closed and s.tail == 3 and len(s.chunks) == 1
    assert h.state.hot_bytes == 3


def test_append_after_close_is_409_with_headers() -> None:
    h = Harness()
    h.create("s", data=b"abcd")
    h.append("s", close=True)
    with pytest.raises(StreamError) as exc:
        h.append("s", b"more")
    assert http_status(exc.value) == 409
    assert protocol_headers(exc.value) == {"Stream-Closed": "true", "Stream-Next-Offset": format_offset(4)}
    with pytest.raises(StreamError) as exc:
        h.append("s", b"more", close=True)
    assert http_status(exc.value) == 409


def test_created_closed_stream_refuses_appends() -> None:
    h = Harness()
    h.create("s", data=b"final", closed=True)
    s = h.stream("s")
    assert s.closed and s.tail == 5
    with pytest.raises(StreamError) as exc:
        h.append("s", b"x")
    assert http_status(exc.value) == 409
    assert protocol_headers(exc.value)["Stream-Next-Offset"] == format_offset(5)
    assert isinstance(h.append("s", close=True), Duplicate)


# --------------------------------------------------------------------------- producers


def test_producer_new_then_duplicate_then_next() -> None:
    h = Harness()
    h.create("s")
    r0 = h.append("s", b"a", producer="p", epoch=0, seq=0)
    assert isinstance(r0, Appended) and (r0.producer, r0.epoch, r0.seq) == ("p", 0, 0)
    dup = h.append("s", b"a", producer="p", epoch=0, seq=0)
    assert isinstance(dup, Duplicate) and (dup.epoch, dup.seq) == (0, 0)
    assert isinstance(h.append("s", b"b", producer="p", epoch=0, seq=1), Appended)
    # A retry of an older sequence reports the highest accepted one.
    dup = h.append("s", b"a", producer="p", epoch=0, seq=0)
    assert isinstance(dup, Duplicate) and (dup.epoch, dup.seq) == (0, 1)
    assert h.read("s") == b"ab"
    assert h.stream("s").producers["p"].last_seq == 1


def test_producer_sequence_gap_is_409_with_headers() -> None:
    h = Harness()
    h.create("s")
    h.append("s", b"a", producer="p", epoch=0, seq=0)
    with pytest.raises(StreamError) as exc:
        h.append("s", b"c", producer="p", epoch=0, seq=2)
    assert http_status(exc.value) == 409
    assert protocol_headers(exc.value) == {"Producer-Expected-Seq": "1", "Producer-Received-Seq": "2"}


def test_producer_stale_epoch_is_403_with_current_epoch() -> None:
    h = Harness()
    h.create("s")
    h.append("s", b"a", producer="p", epoch=0, seq=0)
    assert isinstance(h.append("s", b"b", producer="p", epoch=3, seq=0), Appended)
    with pytest.raises(StreamError) as exc:
        h.append("s", b"z", producer="p", epoch=2, seq=1)
    assert http_status(exc.value) == 403
    assert protocol_headers(exc.value) == {"Producer-Epoch": "3"}
    assert h.stream("s").producers["p"].epoch == 3


def test_producer_epoch_bump_must_start_at_seq_zero() -> None:
    h = Harness()
    h.create("s")
    h.append("s", b"a", producer="p", epoch=0, seq=0)
    with pytest.raises(StreamError) as exc:
        h.append("s", b"b", producer="p", epoch=1, seq=1)
    assert http_status(exc.value) == 400
    # A brand-new producer must start at 0 too.
    with pytest.raises(StreamError) as exc:
        h.append("s", b"b", producer="fresh", epoch=0, seq=5)
    assert http_status(exc.value) == 400
    # And a new producer may start at any epoch.
    assert isinstance(h.append("s", b"c", producer="late", epoch=7, seq=0), Appended)


def test_producers_are_independent_and_per_stream() -> None:
    h = Harness()
    h.create("s")
    h.create("t")
    h.append("s", b"1", producer="p", seq=0)
    h.append("s", b"2", producer="q", seq=0)
    h.append("s", b"3", producer="p", seq=1)
    assert isinstance(h.append("t", b"x", producer="p", seq=0), Appended)
    assert {k: (v.epoch, v.last_seq) for k, v in h.stream("s").producers.items()} == {
        "p": (0, 1),
        "q": (0, 0),
    }
    assert h.read("s") == b"123"


def test_close_by_producer_then_same_tuple_is_duplicate() -> None:
    h = Harness()
    h.create("s")
    h.append("s", b"a", producer="p", epoch=0, seq=0)
    rec = h.append("s", b"b", producer="p", epoch=0, seq=1, close=True)
    assert isinstance(rec, Appended)
    s = h.stream("s")
    assert s.closed and s.closed_by == ("p", 0, 1)
    dup = h.append("s", b"b", producer="p", epoch=0, seq=1, close=True)
    assert isinstance(dup, Duplicate) and (dup.epoch, dup.seq) == (0, 1)
    # Another tuple carrying data is refused; a bare close stays a duplicate.
    with pytest.raises(StreamError) as exc:
        h.append("s", b"c", producer="p", epoch=0, seq=2)
    assert http_status(exc.value) == 409 and protocol_headers(exc.value)["Stream-Closed"] == "true"
    dup2 = h.append("s", producer="q", epoch=0, seq=0, close=True)
    assert isinstance(dup2, Duplicate) and (dup2.epoch, dup2.seq) == (None, None)
    assert h.read("s") == b"ab"


# --------------------------------------------------------------------------- Stream-Seq


def test_stream_seq_must_increase_lexicographically() -> None:
    h = Harness()
    h.create("s")
    assert isinstance(h.append("s", b"1", stream_seq="a"), Appended)
    assert isinstance(h.append("s", b"2", stream_seq="b"), Appended)
    for bad in ("b", "a", "", "ab"):
        with pytest.raises(StreamError) as exc:
            h.append("s", b"x", stream_seq=bad)
        assert http_status(exc.value) == 409
    # An append without Stream-Seq neither checks nor resets it.
    assert isinstance(h.append("s", b"3"), Appended)
    assert h.stream("s").stream_seq == "b"
    assert isinstance(h.append("s", b"4", stream_seq="c"), Appended)
    # Byte-wise, "10" < "9".
    h.create("t")
    h.append("t", b"x", stream_seq="9")
    with pytest.raises(StreamError):
        h.append("t", b"y", stream_seq="10")
    assert fingerprint(h.replay()) == fingerprint(h.state)


# --------------------------------------------------------------------------- TTL and expiry


def test_ttl_expiry_is_404_and_activity_extends_it() -> None:
    h = Harness()
    h.create("s", now=0, ttl_s=10, data=b"x")
    assert h.state.lookup(B, "s", 9_999).uid == 1
    with pytest.raises(StreamError) as exc:
        h.state.lookup(B, "s", 10_000)
    assert http_status(exc.value) == 404
    h.append("s", b"y", now=5_000)
    assert h.state.lookup(B, "s", 14_999).tail == 2
    for fn in (
        lambda: h.state.lookup(B, "s", 15_000),
        lambda: h.append("s", b"z", now=15_000),
        lambda: h.state.decide_delete(B, "s", 15_000),
    ):
        with pytest.raises(StreamError) as exc:
            fn()
        assert http_status(exc.value) == 404
    # Expiry is lazy: nothing is journaled by merely looking.
    assert h.state.find(B, "s") is not None


def test_expires_at_is_absolute() -> None:
    h = Harness()
    h.create("s", now=0, expires_at_ms=1_000)
    h.append("s", b"x", now=900)  # activity does not extend an absolute expiry
    assert h.state.lookup(B, "s", 999).tail == 1
    with pytest.raises(StreamError) as exc:
        h.state.lookup(B, "s", 1_000)
    assert http_status(exc.value) == 404
    assert h.stream("s").expires_at == "at:1000"


def test_ttl_zero_expires_immediately() -> None:
    h = Harness()
    h.create("s", now=50, ttl_s=0)
    with pytest.raises(StreamError):
        h.state.lookup(B, "s", 50)


def test_recreate_over_expired_path_emits_expired_then_created() -> None:
    h = Harness()
    h.create("s", now=0, ttl_s=1, data=b"old")
    h.append("s", b"-data", producer="p", seq=0)
    old_uid = h.stream("s").uid
    records, existing = h.decide_create("s", now=5_000, content_type="text/plain", data=b"new")
    assert existing is None
    assert [type(r) for r in records] == [StreamExpired, StreamCreated]
    assert records[0] == StreamExpired(uid=old_uid, ts_ms=5_000)
    assert isinstance(records[1], StreamCreated) and records[1].uid == old_uid + 1
    h.commit(records)
    s = h.stream("s")
    assert s.uid == old_uid + 1 and s.content_type == "text/plain"
    assert old_uid not in h.state.streams
    assert s.producers == {} and not s.closed
    assert h.read("s") == b"new"
    assert h.state.hot_bytes == 3
    assert fingerprint(h.replay()) == fingerprint(h.state)


def test_recreate_over_live_path_with_other_config_is_still_409() -> None:
    h = Harness()
    h.create("s", now=0, ttl_s=10)
    assert status_of(h.decide_create, "s") == 409
    # ... but once expired, any configuration may take the path.
    records, _ = h.decide_create("s", now=10_000)
    assert [type(r) for r in records] == [StreamExpired, StreamCreated]


# --------------------------------------------------------------------------- touch


def test_touch_journals_at_most_every_quarter_ttl() -> None:
    h = Harness()
    h.create("s", now=0, ttl_s=100)  # quarter TTL = 25 s
    s = h.stream("s")
    assert h.state.touch(s, 1_000) is None
    assert s.last_access_ms == 1_000  # in memory, exact
    assert h.state.touch(s, 24_999) is None
    rec = h.state.touch(s, 25_000)
    assert rec == StreamTouched(uid=s.uid, ts_ms=25_000)
    # Until the record is applied the cadence has not moved.
    assert h.state.touch(s, 25_001) is not None
    h.commit([rec])
    assert s.touch_journaled_ms == 25_000
    assert h.state.touch(s, 26_000) is None
    assert h.state.touch(s, 49_999) is None
    assert h.state.touch(s, 50_000) is not None
    # Touch keeps the stream alive: expiry is relative to the last access.
    assert h.state.lookup(B, "s", 50_000 + 99_999) is s
    with pytest.raises(StreamError):
        h.state.lookup(B, "s", 150_000)


def test_touch_never_moves_last_access_backwards_and_ignores_non_ttl_streams() -> None:
    h = Harness()
    h.create("s", now=10_000, ttl_s=100)
    s = h.stream("s")
    assert h.state.touch(s, 5_000) is None
    assert s.last_access_ms == 10_000
    h.create("forever", now=0)
    h.create("deadline", now=0, expires_at_ms=10**9)
    for name in ("forever", "deadline"):
        t = h.stream(name)
        assert h.state.touch(t, 10**8) is None
        assert t.last_access_ms == 0


def test_replayed_touch_restores_last_access() -> None:
    h = Harness()
    h.create("s", now=0, ttl_s=100)
    s = h.stream("s")
    h.commit([h.state.touch(s, 30_000)])  # type: ignore[list-item]
    assert h.state.touch(s, 40_000) is None  # in memory only
    replayed = h.replay()
    r = replayed.streams[s.uid]
    assert r.last_access_ms == 30_000 and r.touch_journaled_ms == 30_000
    # The restart may move expiry earlier by less than a quarter TTL, never later.
    assert s.last_access_ms - r.last_access_ms < 100 * 250


# --------------------------------------------------------------------------- forks


def test_fork_offset_bounds() -> None:
    h = Harness()
    h.create("src", data=b"abcdef")
    src = h.stream("src")
    for bad in (-1, 7, 100):
        with pytest.raises(StreamError) as exc:
            h.decide_create("f", fork=ForkRequest(src.uid, bad, f"src@{bad}"))
        assert http_status(exc.value) == 400
    for i, good in enumerate((0, 3, 6)):
        h.create(f"f{i}", fork=ForkRequest(src.uid, good, f"src@{good}"))
        f = h.stream(f"f{i}")
        assert f.tail == good and f.fork_offset == good and f.fork_source == src.uid
        assert h.read(f) == b"abcdef"[:good]
    assert src.forks == 3


def test_fork_of_missing_or_deleted_source() -> None:
    h = Harness()
    with pytest.raises(StreamError) as exc:
        h.decide_create("f", fork=ForkRequest(99, 0, "x"))
    assert http_status(exc.value) == 404
    h.create("src", data=b"abc")
    h.create("f1", fork=h.fork_request("src"))
    src_uid = h.stream("src").uid
    h.delete("src")  # soft: f1 still reads through it
    with pytest.raises(StreamError) as exc:
        h.decide_create("f2", fork=ForkRequest(src_uid, 1, "src@1"))
    assert http_status(exc.value) == 409


def test_fork_content_type_inheritance_and_mismatch() -> None:
    h = Harness()
    h.create("src", content_type="application/json", data=b"1\n2\n")
    (rec,) = h.create("f", fork=h.fork_request("src", 2))
    assert isinstance(rec, StreamCreated) and rec.content_type == "application/json"
    assert h.stream("f").json
    h.create("g", content_type="application/json; charset=utf-8", fork=h.fork_request("src", 2, spec="g"))
    assert h.stream("g").content_type == "application/json; charset=utf-8"
    with pytest.raises(StreamError) as exc:
        h.decide_create("x", content_type="text/plain", fork=h.fork_request("src", 2))
    assert http_status(exc.value) == 409
    # Idempotent re-create of a fork without Content-Type matches the inherited type ...
    records, existing = h.decide_create("f", fork=h.fork_request("src", 2))
    assert records == [] and existing is h.stream("f")
    # ... and with an explicit, equal one too; a different type or fork spec is a conflict.
    records, existing = h.decide_create("f", content_type="application/json", fork=h.fork_request("src", 2))
    assert records == [] and existing is h.stream("f")
    with pytest.raises(StreamError) as exc:
        h.decide_create("f", fork=h.fork_request("src", 1))
    assert http_status(exc.value) == 409


_T_SRC = 10**9
_T_FORK = 2 * 10**9


@pytest.mark.parametrize(
    ("source", "request_", "expected"),
    [
        # (source expiry, fork request, fork gets (ttl_s, expires_at_ms))
        (None, None, (None, None)),
        (None, ("ttl", 30), (30, None)),
        (None, ("at", _T_FORK), (None, _T_FORK)),
        (("ttl", 60), None, (60, None)),
        (("ttl", 60), ("ttl", 30), (30, None)),
        (("ttl", 60), ("at", _T_FORK), (None, _T_FORK)),
        (("at", _T_SRC), None, (None, _T_SRC)),
        (("at", _T_SRC), ("ttl", 30), (30, None)),
        (("at", _T_SRC), ("at", _T_FORK), (None, _T_FORK)),
    ],
)
def test_fork_ttl_inheritance_table(
    source: tuple[str, int] | None, request_: tuple[str, int] | None, expected: tuple[int | None, int | None]
) -> None:
    def expiry(spec: tuple[str, int] | None) -> dict[str, int]:
        if spec is None:
            return {}
        return {"ttl_s": spec[1]} if spec[0] == "ttl" else {"expires_at_ms": spec[1]}

    h = Harness()
    h.create("src", now=1_000, data=b"abc", **expiry(source))
    (rec,) = h.create("f", now=2_000, fork=h.fork_request("src", 2, now=2_000), **expiry(request_))
    assert isinstance(rec, StreamCreated)
    assert (rec.ttl_s, rec.expires_at_ms) == expected
    f = h.stream("f")
    assert (f.ttl_s, f.expires_at_ms) == expected
    if expected[1] is not None:
        assert f.expires_at == f"at:{expected[1]}"
    if expected[0] is not None:
        # An inherited TTL is a sliding window of the fork's own, from its creation.
        assert f.last_access_ms == 2_000
    # Re-creating the fork with no expiry headers matches whatever it inherited or chose.
    if request_ is None:
        records, existing = h.decide_create("f", now=2_001, fork=h.fork_request("src", 2, now=2_001))
        assert records == [] and existing is f


def test_fork_of_closed_source_starts_open() -> None:
    h = Harness()
    h.create("src", data=b"abc", closed=True)
    h.create("f", fork=h.fork_request("src"))
    f = h.stream("f")
    assert not f.closed
    assert isinstance(h.append("f", b"def"), Appended)
    assert h.read("f") == b"abcdef"
    assert h.read("src") == b"abc"


def test_fork_reads_stitch_source_and_fork_bytes() -> None:
    h = Harness()
    h.create("src", data=b"hello")
    h.append("src", b" world")
    h.create("f", fork=h.fork_request("src", 5), data=b" there")
    h.append("src", b"!!!")  # after the fork point: invisible to the fork
    h.append("f", b", friend")
    assert h.read("src") == b"hello world!!!"
    want = b"hello there, friend"
    assert h.read("f") == want
    f = h.stream("f")
    assert f.tail == len(want)
    for a in range(len(want) + 1):
        for b in range(a, len(want) + 1):
            assert h.read(f, a, b) == want[a:b], (a, b)
    # The boundary-spanning read is one slice from the source, then the fork's.
    src = h.stream("src")
    slices = h.state.plan_read(f, 3, 8)
    assert len(slices) == 2
    assert slices[0].segment == src.chunks.segs[0] and slices[0].position == src.chunks.poss[0] + 3
    assert slices[0].length == 2
    assert (slices[1].segment, slices[1].position, slices[1].length) == (
        f.chunks.segs[0],
        f.chunks.poss[0],
        3,
    )
    # Reads entirely inside the inherited range come only from the source.
    assert all(sl.segment in set(src.chunks.segs) for sl in h.state.plan_read(f, 0, 5))
    assert h.state.plan_read(f, 5, 5) == []


def test_three_level_forks() -> None:
    h = Harness()
    h.create("a", data=b"AAAA")
    h.append("a", b"aaaa")
    h.create("b", fork=h.fork_request("a", 6), data=b"BB")
    h.append("b", b"bbb")
    h.create("c", fork=h.fork_request("b", 3), data=b"C")  # inside a's range, via b
    h.create("d", fork=h.fork_request("b", 9), data=b"DD")  # inside b's own range
    h.append("a", b"late")
    h.append("b", b"later")
    assert h.read("a") == b"AAAAaaaalate"
    assert h.read("b") == b"AAAAaaBBbbblater"
    assert h.read("c") == b"AAAC"
    assert h.read("d") == b"AAAAaaBBbDD"
    d = h.stream("d")
    for a in range(d.tail + 1):
        assert h.read(d, a) == b"AAAAaaBBbDD"[a:]
        assert h.read(d, 0, a) == b"AAAAaaBBbDD"[:a]


def test_appends_and_producers_on_a_fork_are_independent() -> None:
    h = Harness()
    h.create("src")
    h.append("src", b"a", producer="p", seq=0, stream_seq="5")
    h.create("f", fork=h.fork_request("src"))
    f = h.stream("f")
    assert f.producers == {} and f.stream_seq is None
    assert isinstance(h.append("f", b"b", producer="p", seq=0, stream_seq="1"), Appended)
    h.append("f", close=True)
    assert not h.stream("src").closed
    assert isinstance(h.append("src", b"c", producer="p", seq=1), Appended)


def test_soft_delete_with_forks_is_410() -> None:
    h = Harness()
    h.create("src", data=b"abc")
    h.create("f", fork=h.fork_request("src", 2))
    src = h.stream("src")
    h.delete("src")
    assert src.soft_deleted and src.uid in h.state.streams
    assert h.state.find(B, "src") is src
    for fn in (
        lambda: h.state.lookup(B, "src", 0),
        lambda: h.append("src", b"x"),
        lambda: h.state.decide_delete(B, "src", 0),
    ):
        with pytest.raises(StreamError) as exc:
            fn()
        assert http_status(exc.value) == 410
    # Re-creating the path is a conflict while the forks need it.
    assert status_of(h.decide_create, "src") == 409
    # The fork still reads the inherited bytes.
    assert h.read("f") == b"ab"
    # Only what the fork inherits is still needed: "c" is released.
    assert h.state.hot_bytes == 2


def test_deleting_last_fork_cascades() -> None:
    h = Harness()
    h.create("a", data=b"aaaa")
    h.create("b", fork=h.fork_request("a", 2), data=b"bb")
    h.create("c", fork=h.fork_request("b", 3), data=b"c")
    h.create("keep", data=b"k")
    ua, ub, uc = (h.stream(p).uid for p in "abc")
    h.delete("a")
    h.delete("b")
    assert h.state.streams[ua].soft_deleted and h.state.streams[ub].soft_deleted
    assert h.read("c") == b"aabc"
    # Only what c inherits is kept: a's [0, 2), b's [2, 3), plus c and keep.
    assert h.state.hot_bytes == 2 + 1 + 1 + 1
    h.delete("c")
    for uid in (ua, ub, uc):
        assert uid not in h.state.streams
    assert h.state.paths == {(B, "keep"): h.stream("keep").uid}
    assert h.state.hot_bytes == 1
    # The paths are free again.
    (rec,) = h.create("a")
    assert isinstance(rec, StreamCreated)


def test_deleting_a_fork_of_a_live_source_keeps_the_source() -> None:
    h = Harness()
    h.create("src", data=b"abc")
    h.create("f1", fork=h.fork_request("src", 1))
    h.create("f2", fork=h.fork_request("src", 2))
    src = h.stream("src")
    assert src.forks == 2
    h.delete("f1")
    assert src.forks == 1 and not src.soft_deleted
    h.delete("src")
    assert src.soft_deleted
    h.delete("f2")
    assert h.state.streams == {} and h.state.paths == {} and h.state.hot_bytes == 0


def test_delete_middle_of_chain_keeps_data_for_the_leaf() -> None:
    h = Harness()
    h.create("a", data=b"12")
    h.create("b", fork=h.fork_request("a"), data=b"34")
    h.create("c", fork=h.fork_request("b"), data=b"56")
    h.delete("b")
    assert h.read("c") == b"123456"
    h.delete("a")
    assert h.read("c") == b"123456"
    assert len(h.state.streams) == 3
    h.delete("c")
    assert h.state.streams == {}


def test_expired_source_with_forks_is_soft_deleted_on_recreate() -> None:
    h = Harness()
    h.create("src", now=0, ttl_s=1, data=b"old")
    h.create("f", now=0, ttl_s=100, fork=h.fork_request("src", 3))
    old_uid = h.stream("src").uid
    records = h.create("src", now=2_000, data=b"new")
    assert [type(r) for r in records] == [StreamExpired, StreamCreated]
    old = h.state.streams[old_uid]
    assert old.soft_deleted
    assert h.stream("src").uid != old_uid
    assert h.read("src") == b"new"
    assert h.read("f") == b"old"
    assert h.state.hot_bytes == 6
    # When the fork goes, the old source goes, and the new stream keeps the path.
    h.delete("f", now=2_000)
    assert old_uid not in h.state.streams
    assert h.state.find(B, "src").uid == records[1].uid  # type: ignore[union-attr]
    assert h.state.hot_bytes == 3
    assert fingerprint(h.replay()) == fingerprint(h.state)


def test_fork_from_an_expired_source_is_refused() -> None:
    h = Harness()
    h.create("src", now=0, ttl_s=1, data=b"abc")
    src_uid = h.stream("src").uid
    with pytest.raises(StreamError) as exc:
        h.decide_create("f", now=5_000, fork=ForkRequest(src_uid, 1, "src@1"))
    assert http_status(exc.value) == 404


def test_fork_of_expired_stream_at_its_own_path_is_consistent() -> None:
    """Forking an expired stream onto its own path: the source is gone (checked first), nothing changes."""
    h = Harness()
    h.create("s", now=0, ttl_s=1, data=b"abc")
    src_uid = h.stream("s").uid
    before = fingerprint(h.state)
    with pytest.raises(StreamError) as exc:
        h.decide_create("s", now=5_000, fork=ForkRequest(src_uid, 1, "s@1"))
    assert exc.value.code is ErrorCode.FORK_SOURCE_NOT_FOUND
    assert fingerprint(h.state) == before


# --------------------------------------------------------------------------- hot_bytes


def test_hot_bytes_accounting() -> None:
    h = Harness()
    assert h.state.hot_bytes == 0
    h.create("a", data=b"12345")
    h.append("a", b"678")
    h.append("a", close=True)
    assert h.state.hot_bytes == 8
    h.create("b", fork=h.fork_request("a", 4), data=b"xy")
    assert h.state.hot_bytes == 10  # a fork only adds its own bytes
    h.delete("a")
    assert h.state.hot_bytes == 6  # a soft-deleted source keeps only what its fork inherits
    h.create("c", now=0, ttl_s=1, data=b"ccc")
    assert h.state.hot_bytes == 9
    h.create("c", now=1_000, data=b"C")  # expired + recreated
    assert h.state.hot_bytes == 7
    h.delete("b")
    assert h.state.hot_bytes == 1
    assert h.replay().hot_bytes == 1


# --------------------------------------------------------------------------- records, replay, snapshot


def test_every_record_type_round_trips_through_msgpack() -> None:
    records: list[Record] = [
        BucketCreated(name="b-1", ts_ms=1),
        StreamCreated(7, B, "p/q", "text/plain", 60, None, None, True, 2, 3, 4, "spec", b"\x00\xff"),
        StreamCreated(
            8, B, "r", "a/b", None, "2024-01-01T00:00:00Z", 1704067200000, False, 2, None, 0, None, b""
        ),
        Appended(7, 4, 5, "prod", 1, 2, "seq", True, b"data"),
        Appended(7, 4, 5, None, 0, 0, None, False, b""),
        StreamDeleted(7, 6),
        StreamTouched(7, 7),
        StreamExpired(7, 8),
    ]
    for r in records:
        body = encode_record(r)
        assert decode_record(body) == r
        data = getattr(r, "data", b"")
        if data:
            # The payload is the tail of the body: readable at body_end - len(data).
            assert body.endswith(data)


def test_replay_reproduces_a_mixed_history() -> None:
    h = Harness()
    h.commit(h.state.decide_bucket("other", 1))
    h.create("a", now=1, data=b"abc", ttl_s=100)
    h.append("a", b"def", now=2, producer="p", seq=0, stream_seq="1")
    h.create("b", now=3, bucket="other", content_type="text/plain")
    h.create("f", now=4, fork=h.fork_request("a", 4, now=4), data=b"F")
    h.append("a", b"g", now=5, producer="p", seq=1, close=True)
    h.commit([h.state.touch(h.stream("a"), 40_000)])  # type: ignore[list-item]
    h.delete("a", now=41_000)
    h.create("x", now=0, ttl_s=1)
    h.create("x", now=50_000, data=b"again")
    replayed = h.replay()
    assert fingerprint(replayed) == fingerprint(h.state)
    snap, pos = decode_snapshot(encode_snapshot(h.state, LogPosition(3, 99)))
    assert pos == LogPosition(3, 99)
    assert fingerprint(snap) == fingerprint(h.state)
    f = h.stream("f")
    assert read_through(snap, h.disk, snap.streams[f.uid], 0, f.tail) == b"abcdF"


# --------------------------------------------------------------------------- incarnations: offsets never reused


def test_a_path_created_again_starts_above_every_offset_it_issued() -> None:
    h = Harness()
    h.create("s", data=b"abc")
    h.append("s", b"de")
    assert h.stream("s").incarnation == 0 and h.state.path_history == {}
    h.delete("s", now=1)
    assert h.state.path_history == {(B, "s"): (1, 5)}  # one stream so far, which issued offsets up to 5
    [created] = h.create("s", data=b"new", now=2)
    assert isinstance(created, StreamCreated) and (created.fork_source, created.fork_offset) == (None, 6)
    s = h.stream("s")
    assert (s.incarnation, s.fork_offset, s.retained_from, s.cold_end, s.tail) == (1, 6, 6, 6, 9)
    assert h.read(s, 6) == b"new"
    appended = h.append("s", b"!")
    assert isinstance(appended, Appended) and appended.offset == 9
    # Every old offset is below the stream's first: the read path answers 410, saying why.
    for old in range(6):
        assert lifecycle.earlier_offset(h.state, s, old)
    assert not lifecycle.earlier_offset(h.state, s, 6)
    h.delete("s", now=3)
    [created] = h.create("s", now=4)
    assert isinstance(created, StreamCreated) and created.fork_offset == 11
    assert h.stream("s").incarnation == 2 and h.state.path_history == {(B, "s"): (2, 10)}
    assert fingerprint(h.replay()) == fingerprint(h.state)
    assert fingerprint(decode_snapshot(encode_snapshot(h.state, LogPosition(1, 8)))[0]) == fingerprint(
        h.state
    )


def test_an_expired_stream_replaced_by_a_create_counts_as_an_earlier_incarnation() -> None:
    h = Harness()
    h.create("t", data=b"12345", ttl_s=1, now=0)
    records = h.create("t", data=b"x", now=1_000)  # expired: the create journals its expiry first
    assert [type(r) for r in records] == [StreamExpired, StreamCreated]
    s = h.stream("t")
    assert (s.incarnation, s.fork_offset, s.tail) == (1, 6, 7)
    assert h.state.path_history == {(B, "t"): (1, 5)}


def test_an_expired_stream_that_forks_still_read_gives_up_its_path_to_the_new_one() -> None:
    h = Harness()
    h.create("src", data=b"abcdef", ttl_s=1, now=0)
    h.create("f", fork=h.fork_request("src", 3), ttl_s=3_600, now=0)
    records = h.create("src", data=b"new", now=1_000)  # src expired: soft-deleted, f still reads it
    assert [type(r) for r in records] == [StreamExpired, StreamCreated]
    s = h.stream("src")
    assert (s.incarnation, s.fork_offset) == (1, 7) and h.state.path_history == {(B, "src"): (1, 6)}
    assert h.read("f") == b"abc"
    h.delete("f", now=1_000)  # the old source goes with its last fork; the path is the new stream's
    assert h.state.path_history == {(B, "src"): (1, 6), (B, "f"): (1, 3)}
    assert h.stream("src") is s and fingerprint(h.replay()) == fingerprint(h.state)


def test_a_soft_deleted_source_leaves_its_history_when_its_last_fork_goes() -> None:
    h = Harness()
    h.create("src", data=b"abcdef")
    h.create("f", fork=h.fork_request("src", 4), data=b"XY")
    h.delete("src")  # soft: the fork reads through it; the path stays blocked
    assert h.state.path_history == {}
    assert status_of(h.decide_create, "src") == 409
    h.delete("f")  # the last fork: both go
    assert h.state.path_history == {(B, "src"): (1, 6), (B, "f"): (1, 6)}
    [created] = h.create("src")
    assert isinstance(created, StreamCreated) and created.fork_offset == 7


def test_an_erased_bucket_takes_its_paths_history_with_it() -> None:
    h = Harness()
    h.commit(h.state.decide_bucket("tmp", 0))
    h.create("a", bucket="tmp", data=b"abc")
    h.delete("a", bucket="tmp")
    h.create("a", data=b"abc")
    h.delete("a")
    assert set(h.state.path_history) == {("tmp", "a"), (B, "a")}
    h.commit([h.state.decide_erase_bucket("tmp", 1)])
    assert set(h.state.path_history) == {(B, "a")}


def test_a_fork_that_would_serve_an_old_offset_of_its_path_is_refused() -> None:
    h = Harness()
    h.create("src", data=b"source")
    h.create("p", data=b"old!")
    h.delete("p")  # p issued offsets 0..4
    journal = len(h.journal)
    with pytest.raises(StreamError) as exc:
        h.decide_create("p", fork=h.fork_request("src", 6))
    assert exc.value.code is ErrorCode.PATH_OFFSETS_USED and http_status(exc.value) == 409
    assert exc.value.context == {"fence": format_offset(4)}
    # A copy from another shard starting at or below the fence too; above it, allowed.
    copy = ForkCopy(b"ce", 4, DEFAULT_CONTENT_TYPE, None, None, None)
    with pytest.raises(StreamError) as exc:
        h.decide_create("p", fork=ForkRequest(None, 6, "src@6", copy))
    assert exc.value.code is ErrorCode.PATH_OFFSETS_USED
    assert len(h.journal) == journal and h.state.find(B, "p") is None
    [created] = h.create(
        "p", fork=ForkRequest(None, 7, "src@7", ForkCopy(b"x", 6, DEFAULT_CONTENT_TYPE, None, None, None))
    )
    assert isinstance(created, StreamCreated) and (created.fork_offset, created.data) == (6, b"x")
    assert h.stream("p").retained_from == 6
    # A plain stream takes such a path above its fence; a fork of it elsewhere keeps its offsets.
    h.delete("p")
    h.create("p", data=b"plain")
    assert h.stream("p").fork_offset == 8
    h.create("q", fork=h.fork_request("p", 10))
    assert h.read("q", 8) == b"pl" and h.stream("q").retained_from == 8


def test_a_fork_offset_below_the_sources_first_offset_is_400() -> None:
    h = Harness()
    h.create("src", data=b"abc")
    h.delete("src")
    h.create("src", data=b"defg")  # offsets 4..8
    for offset, why in ((0, "earlier stream"), (3, "earlier stream")):
        with pytest.raises(StreamError) as exc:
            h.decide_create("f", fork=h.fork_request("src", offset))
        assert exc.value.code is ErrorCode.BAD_REQUEST and why in exc.value.message
    h.create("f", fork=h.fork_request("src", 4))
    assert h.stream("f").tail == 4 and h.stream("f").retained_from == 4


def test_a_path_created_again_thousands_of_times_keeps_working() -> None:
    """One above the fence, not a fresh 10^16 block each time: offsets stay far inside 64 bits."""
    h = Harness()
    for i in range(3_000):
        h.create("churn", data=b"x" * (i % 5), now=i)
        h.delete("churn", now=i)
    s_history = h.state.path_history[(B, "churn")]
    assert s_history.incarnations == 3_000
    h.create("churn", data=b"last", now=3_000)
    s = h.stream("churn")
    assert s.incarnation == 3_000 and s.fork_offset == s_history.fence + 1 < 2**40
    assert h.read(s, s.fork_offset) == b"last"


# --------------------------------------------------------------------------- property: model-based


PATHS = ["a", "b", "c", "d", "e"]
CTS = [None, "application/octet-stream", "text/plain", "text/plain; charset=utf-8"]
EXPIRIES: list[tuple[str, int] | None] = [None, None, ("ttl", 1), ("ttl", 3), ("at", 1_500)]


@dataclass
class MStream:
    uid: int
    path: str
    content: bytearray
    own_bytes: int
    content_type: str
    ttl_s: int | None
    expires_at_ms: int | None
    last_access: int
    closed: bool
    fork_source: MStream | None
    fork_spec: str | None
    closed_by: tuple[str, int, int] | None = None
    producers: dict[str, tuple[int, int]] = field(default_factory=dict)
    forks: int = 0
    soft_deleted: bool = False
    base: int = 0  # the offset of content[0]: above every offset the path issued before
    incarnation: int = 0

    @property
    def tail(self) -> int:
        return self.base + len(self.content)

    def expired(self, now: int) -> bool:
        if self.expires_at_ms is not None and now >= self.expires_at_ms:
            return True
        return self.ttl_s is not None and now >= self.last_access + self.ttl_s * 1000


class Model:
    """The reference: every stream is just its full byte string plus flags."""

    def __init__(self) -> None:
        self.objs: dict[int, MStream] = {}
        self.paths: dict[str, int] = {}
        self.history: dict[str, tuple[int, int]] = {}  # path -> (streams it held, highest offset issued)

    def at(self, path: str) -> MStream | None:
        uid = self.paths.get(path)
        return None if uid is None else self.objs[uid]

    def lookup(self, path: str, now: int) -> MStream | int:
        s = self.at(path)
        if s is None or (not s.soft_deleted and s.expired(now)):
            return 404
        if s.soft_deleted:
            return 410
        return s

    def kill(self, s: MStream) -> None:
        if s.forks > 0:
            s.soft_deleted = True
            s.producers.clear()  # nobody appends to it again: its producers' state goes (lifecycle.apply_gone)
            return
        while True:
            del self.objs[s.uid]
            if self.paths.get(s.path) == s.uid:
                del self.paths[s.path]
                _, fence = self.history.get(s.path, (0, -1))
                self.history[s.path] = (s.incarnation + 1, max(fence, s.tail))
            src = s.fork_source
            if src is None:
                return
            src.forks -= 1
            if not (src.soft_deleted and src.forks == 0):
                return
            s = src

    def _need_end(self, s: MStream) -> int:
        """How far into ``s``'s offsets readers still reach: all of a live stream,
        only what forks inherit of a soft-deleted one."""
        if not s.soft_deleted:
            return len(s.content)
        ends = [
            min(len(c.content) - c.own_bytes, self._need_end(c))
            for c in self.objs.values()
            if c.fork_source is s
        ]
        return max(ends, default=0)

    @property
    def hot_bytes(self) -> int:
        total = 0
        for s in self.objs.values():
            own_start = len(s.content) - s.own_bytes
            total += max(0, min(len(s.content), self._need_end(s)) - own_start)
        return total


def _expiry_kwargs(spec: tuple[str, int] | None, now: int) -> dict[str, int]:
    if spec is None:
        return {}
    return {"ttl_s": spec[1]} if spec[0] == "ttl" else {"expires_at_ms": now + spec[1]}


def _same_config(
    s: MStream, ct: str | None, ttl: int | None, exp: int | None, closed: bool, spec: str | None
) -> bool:
    wanted = ct if ct is not None else (s.content_type if spec is not None else DEFAULT_CONTENT_TYPE)
    same = media_type(wanted) == media_type(s.content_type) and closed == s.closed and spec == s.fork_spec
    if spec is None or ttl is not None or exp is not None:
        same = same and ttl == s.ttl_s and exp == s.expires_at_ms
    return same


class Runner:
    def __init__(self) -> None:
        self.h = Harness()
        self.m = Model()
        self.now = 0

    # Each step predicts the outcome with the model, runs decide/apply, and compares.

    def create(
        self, path: str, ct: str | None, expiry: Any, closed: bool, data: bytes, fork: Any = None
    ) -> None:
        h, m, now = self.h, self.m, self.now
        kw = _expiry_kwargs(expiry, now)
        ttl, exp = kw.get("ttl_s"), kw.get("expires_at_ms")
        src: MStream | None = None
        freq: ForkRequest | None = None
        if fork is not None:
            src_path, frac = fork
            resolved = m.lookup(src_path, now)
            # The HTTP layer resolves the source with lookup first; mirror it.
            try:
                s_state = h.state.lookup(B, src_path, now)
            except StreamError as exc:
                assert http_status(exc) == resolved
                event(f"fork source lookup {http_status(exc)}")
                return
            assert isinstance(resolved, MStream) and resolved.uid == s_state.uid
            src = resolved
            offset = src.tail + 1 if frac is None else src.base + int(frac * len(src.content))
            freq = ForkRequest(src.uid, offset, f"{src_path}@{offset}")
        spec = None if freq is None else freq.spec

        expected: int | str = "created"
        existing = m.at(path)
        expire_first = False
        if existing is not None:
            if existing.soft_deleted:
                expected = 409
            elif existing.expired(now):
                expire_first = True
            else:
                expected = "match" if _same_config(existing, ct, ttl, exp, closed, spec) else 409
        incarnation, fence = m.history.get(path, (0, None))
        if expire_first:
            assert existing is not None
            incarnation = existing.incarnation + 1
            fence = existing.tail if fence is None else max(fence, existing.tail)
        # A plain stream starts one above every offset the path issued.
        base = 0 if fence is None else fence + 1
        if expected == "created" and src is not None and freq is not None:
            base = src.base  # a fork keeps its source's offsets
            if ct is not None and media_type(ct) != media_type(src.content_type):
                expected = 409
            elif not src.base <= freq.offset <= src.tail:
                expected = 400
            elif fence is not None and src.base <= fence:
                expected = 409  # it would serve offsets an earlier stream at the path issued

        try:
            records, found = h.decide_create(
                path, now=now, content_type=ct, closed=closed, data=data, fork=freq, **kw
            )
        except StreamError as exc:
            assert http_status(exc) == expected, (http_status(exc), exc.message, expected)
            event(f"create refused {http_status(exc)}")
            return
        if expected == "match":
            event("create matched existing")
            assert records == [] and found is not None and existing is not None and found.uid == existing.uid
            return
        assert expected == "created", (expected, records)
        kinds = [type(r) for r in records]
        assert kinds == ([StreamExpired, StreamCreated] if expire_first else [StreamCreated])
        created = records[-1]
        assert isinstance(created, StreamCreated)
        h.commit(records)
        event("fork created" if src is not None else "stream created")
        if expire_first:
            assert existing is not None
            event("expired stream replaced" + (" (soft, has forks)" if existing.forks else ""))
            m.kill(existing)
            if m.paths.get(path) == existing.uid:  # soft-deleted: it gives up its path to the new stream
                _, old_fence = m.history.get(path, (0, -1))
                m.history[path] = (existing.incarnation + 1, max(old_fence, existing.tail))
        assert created.fork_offset == (freq.offset if freq is not None else base)
        if src is not None and freq is not None:
            prefix = bytes(src.content[: freq.offset - src.base])
            if ttl is None and exp is None:
                ttl, exp = src.ttl_s, src.expires_at_ms
            ctype = ct or src.content_type
            src.forks += 1
        else:
            prefix = b""
            ctype = ct or DEFAULT_CONTENT_TYPE
        m.objs[created.uid] = MStream(
            uid=created.uid,
            path=path,
            content=bytearray(prefix + data),
            own_bytes=len(data),
            content_type=ctype,
            ttl_s=ttl,
            expires_at_ms=exp,
            last_access=now,
            closed=closed,
            fork_source=src,
            fork_spec=spec,
            base=base,
            incarnation=incarnation,
        )
        m.paths[path] = created.uid

    def append(self, path: str, data: bytes, close: bool, producer: tuple[str, int, int] | None) -> None:
        h, m, now = self.h, self.m, self.now
        s = m.lookup(path, now)
        expected: int | str = "appended"
        if isinstance(s, int):
            expected = s
        elif s.closed:
            if producer is not None and producer == s.closed_by:
                expected = "dup"
            elif not data and close:
                expected = "dup"
            else:
                expected = 409
        elif producer is not None:
            pid, epoch, seq = producer
            p = s.producers.get(pid)
            if p is not None and epoch < p[0]:
                expected = 403
            elif p is None or epoch > p[0]:
                if seq != 0:
                    expected = 400
            elif seq <= p[1]:
                expected = "dup"
            elif seq > p[1] + 1:
                expected = 409
        pid, epoch, seq = producer if producer is not None else (None, 0, 0)
        try:
            decided = h.append(path, data, now=now, close=close, producer=pid, epoch=epoch, seq=seq)
        except StreamError as exc:
            assert http_status(exc) == expected, (http_status(exc), exc.message, expected)
            event(f"append refused {http_status(exc)}")
            return
        if expected == "dup":
            assert isinstance(decided, Duplicate)
            event("append duplicate")
            return
        assert expected == "appended" and isinstance(decided, Appended), (expected, decided)
        assert isinstance(s, MStream)
        assert decided.offset == s.tail
        s.content += data
        s.own_bytes += len(data)
        s.last_access = max(s.last_access, now)
        if pid is not None:
            s.producers[pid] = (epoch, seq)
        if close:
            s.closed = True
            if pid is not None:
                s.closed_by = (pid, epoch, seq)

    def delete(self, path: str) -> None:
        h, m, now = self.h, self.m, self.now
        s = m.lookup(path, now)
        try:
            h.delete(path, now=now)
        except StreamError as exc:
            assert http_status(exc) == s
            return
        assert isinstance(s, MStream)
        event("soft delete" if s.forks else "delete")
        m.kill(s)

    def check(self) -> None:
        h, m = self.h, self.m
        state = h.state
        assert set(state.streams) == set(m.objs)
        assert state.paths == {(B, p): uid for p, uid in m.paths.items()}
        assert state.hot_bytes == m.hot_bytes
        assert {p: tuple(h) for (b, p), h in state.path_history.items()} == m.history
        for uid, ms in m.objs.items():
            s = state.streams[uid]
            assert s.tail == ms.tail and s.incarnation == ms.incarnation
            assert s.closed == ms.closed and s.closed_by == ms.closed_by
            assert {k: (p.epoch, p.last_seq) for k, p in s.producers.items()} == ms.producers
            assert s.soft_deleted == ms.soft_deleted and s.forks == ms.forks
            assert (s.ttl_s, s.expires_at_ms) == (ms.ttl_s, ms.expires_at_ms)
        for p in PATHS:
            want = m.lookup(p, self.now)
            try:
                got: int = state.lookup(B, p, self.now).uid
            except StreamError as exc:
                got = http_status(exc)
            assert got == (want if isinstance(want, int) else want.uid)

    def check_reads(self, state: StreamState) -> None:
        for uid, ms in self.m.objs.items():
            if ms.soft_deleted:
                continue  # 410 to readers; what its forks inherit is read through them
            s = state.streams[uid]
            want = bytes(ms.content)
            n, b = len(want), ms.base
            assert s.retained_from == b
            assert read_through(state, self.h.disk, s, b, b + n) == want
            for a in range(n + 1):
                assert read_through(state, self.h.disk, s, b + a, b + n) == want[a:]
                assert read_through(state, self.h.disk, s, b, b + a) == want[:a]
                assert read_through(state, self.h.disk, s, b + a, b + min(n, a + 3)) == want[a : a + 3]


_path = st.sampled_from(PATHS)
_producer = st.one_of(
    st.none(),
    st.tuples(st.sampled_from(["p", "q"]), st.integers(0, 1), st.integers(0, 2)),
)
_early_path = st.sampled_from(PATHS[:3])


def _create_on(paths: st.SearchStrategy[str]) -> st.SearchStrategy[tuple[Any, ...]]:
    return st.tuples(
        st.just("create"),
        paths,
        st.sampled_from(CTS),
        st.sampled_from(EXPIRIES),
        st.booleans(),
        st.binary(max_size=5),
    )


_create = _create_on(st.sampled_from(PATHS[:4]))
_fork = st.tuples(
    st.just("fork"),
    _early_path,
    _path,
    st.sampled_from([0.0, 0.5, 1.0, None]),  # None: one past the tail
    st.sampled_from([None, None, "application/octet-stream", "text/plain"]),
    st.sampled_from(EXPIRIES),
    st.binary(max_size=4),
)
_append = st.tuples(st.just("append"), _path, st.binary(min_size=1, max_size=6), st.booleans(), _producer)
_plain_append = st.tuples(
    st.just("append"), _path, st.binary(min_size=1, max_size=6), st.just(False), st.just(None)
)
_close = st.tuples(st.just("close"), _path, _producer)
_delete = st.tuples(st.just("delete"), _path)
_advance = st.tuples(st.just("advance"), st.sampled_from([0, 400, 1_000, 2_500]))
_commands = st.one_of(
    _create,
    _create,
    _fork,
    _fork,
    _fork,
    _append,
    _plain_append,
    _plain_append,
    _close,
    _delete,
    _delete,
    _advance,
)
_histories = st.tuples(
    st.lists(_create_on(_early_path), min_size=2, max_size=3), st.lists(_commands, min_size=12, max_size=40)
).map(lambda t: t[0] + t[1])


# Found by hypothesis (a hot_bytes mismatch): a source forked by c, c forked by b below c's fork point,
# then a and c deleted (soft: b reads through both). a kept its bytes up to c's fork point although c,
# soft-deleted, needs only what b inherits: a source keeps no more than its soft-deleted fork needs.
_SOFT_DELETED_FORK_CHAIN = [
    ("create", "a", None, None, False, b"\x00"),
    ("append", "a", b"\x00", False, None),
    ("fork", "a", "c", 1.0, None, None, b""),
    ("fork", "c", "b", 0.5, None, None, b""),
    ("delete", "a"),
    ("create", "a", None, None, False, b""),
    ("delete", "c"),
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(commands=_histories, snapshot_at=st.integers(min_value=0, max_value=43))
@example(commands=_SOFT_DELETED_FORK_CHAIN, snapshot_at=0)
def test_model_based_decide_apply_read_replay_snapshot(
    commands: list[tuple[Any, ...]], snapshot_at: int
) -> None:
    r = Runner()
    snap: tuple[bytes, int] | None = None
    for i, cmd in enumerate(commands):
        kind = cmd[0]
        if kind == "create":
            _, path, ct, expiry, closed, data = cmd
            r.create(path, ct, expiry, closed, data)
        elif kind == "fork":
            _, src, dst, frac, ct, expiry, data = cmd
            r.create(dst, ct, expiry, False, data, fork=(src, frac))
        elif kind == "append":
            _, path, data, close, producer = cmd
            r.append(path, data, close, producer)
        elif kind == "close":
            _, path, producer = cmd
            r.append(path, b"", True, producer)
        elif kind == "delete":
            r.delete(cmd[1])
        elif kind == "advance":
            r.now += cmd[1]
        r.check()
        if i == snapshot_at:
            snap = (encode_snapshot(r.h.state, LogPosition(1, len(r.h.journal))), len(r.h.journal))

    state = r.h.state
    # Reads through plan_read + the fake disk give exactly the model's bytes.
    r.check_reads(state)

    # Replaying the journal (through msgpack) rebuilds the same state.
    replayed = r.h.replay()
    assert fingerprint(replayed) == fingerprint(state)
    r.check_reads(replayed)

    # A snapshot round trip is equivalent (snapshots record who holds each path).
    restored, pos = decode_snapshot(encode_snapshot(state, LogPosition(7, 1234)))
    assert pos == LogPosition(7, 1234)
    assert fingerprint(restored) == fingerprint(state)
    assert restored.paths.items() >= state.paths.items()
    r.check_reads(restored)

    # A snapshot taken mid-history plus the rest of the journal is equivalent too.
    if snap is not None:
        data, n = snap
        mid, mid_pos = decode_snapshot(data)
        assert mid_pos == LogPosition(1, n)
        for rec, loc in r.h.journal[n:]:
            mid.apply(rec, loc)
        assert fingerprint(mid) == fingerprint(state)
        r.check_reads(mid)
