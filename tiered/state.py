"""The stream state machine: the deterministic core of the service.

Requests are *decided* against the current state, producing journal records
(or a ``StreamError`` that changes nothing); records are *applied* to move the
state forward. Replay after a restart is just ``apply`` over the journal, so
decide must put everything apply needs (uids, timestamps, offsets) into the
record. Nothing here touches a disk, a socket or a clock: time comes in as
``now_ms``, and data locations come in as opaque ``(segment, position)``.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tiered.cold.chunk_index import ChunkIndex

from .content import DEFAULT_CONTENT_TYPE, is_json, media_type
from .ids import DEFAULT_BUCKET, format_offset
from .records import (
    Appended,
    BucketCreated,
    BucketErased,
    ColdCopyAborted,
    ColdCopyCommitted,
    ColdCopyStarted,
    ColdDeleteFinished,
    ColdDeleteStarted,
    HotTrimmed,
    Record,
    RetentionAdvanced,
    RetentionPolicySet,
    StreamCreated,
    StreamDeleted,
    StreamExpired,
    StreamTouched,
)


class StreamError(Exception):
    """A request the state refuses, with the HTTP status that explains why."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}
        self.code = code


@dataclass(slots=True)
class ProducerState:
    epoch: int
    last_seq: int


class HotChunks:
    """Where a stream's hot bytes live: parallel arrays, one entry per append."""

    __slots__ = ("starts", "lens", "segs", "poss", "times")

    def __init__(self) -> None:
        self.starts = array("q")
        self.lens = array("q")
        self.segs = array("q")
        self.poss = array("q")
        self.times = array("q")

    def arrays(self) -> tuple[array, array, array, array, array]:
        return self.starts, self.lens, self.segs, self.poss, self.times

    def add(self, start: int, length: int, seg: int, pos: int, ts_ms: int) -> None:
        self.starts.append(start)
        self.lens.append(length)
        self.segs.append(seg)
        self.poss.append(pos)
        self.times.append(ts_ms)

    def trim_below(self, offset: int) -> None:
        """Forget chunks that end at or before ``offset``."""
        n = 0
        while n < len(self.starts) and self.starts[n] + self.lens[n] <= offset:
            n += 1
        if n:
            for arr in self.arrays():
                del arr[:n]

    def trim_from(self, offset: int) -> None:
        """Forget chunks that start at or after ``offset``."""
        n = len(self.starts)
        while n > 0 and self.starts[n - 1] >= offset:
            n -= 1
        if n < len(self.starts):
            for arr in self.arrays():
                del arr[n:]

    @property
    def start(self) -> int | None:
        return self.starts[0] if self.starts else None

    def __len__(self) -> int:
        return len(self.starts)


@dataclass(frozen=True, slots=True)
class ColdRef:
    """A stream range served by a cold object."""

    start: int
    end: int
    key: str


@dataclass(slots=True)
class ColdObject:
    key: str
    size: int
    crc32c: int
    created_ms: int
    index: ChunkIndex
    refs: int = 0  # live stream ranges that read from it
    released_ms: int | None = None  # when refs last reached zero (the grace delay starts)
    deleting: bool = False  # a journaled delete is under way


@dataclass(slots=True)
class Stream:
    uid: int
    bucket: str
    path: str
    content_type: str
    ttl_s: int | None
    expires_at: str | None
    expires_at_ms: int | None
    created_ms: int
    fork_source: int | None
    fork_offset: int  # first offset of the stream's own data
    fork_spec: str | None
    tail: int
    closed: bool = False
    closed_by: tuple[str, int, int] | None = None
    producers: dict[str, ProducerState] = field(default_factory=dict)
    stream_seq: str | None = None
    chunks: HotChunks = field(default_factory=HotChunks)
    cold_refs: list[ColdRef] = field(default_factory=list)
    cold_end: int = -1  # own data below this is in cold objects (set to fork_offset at creation)
    forks: int = 0  # live forks that read through this stream
    retained_from: int = 0  # reads below this get 410 Gone
    retention_ms: int | None = None
    retention_bytes: int | None = None
    keep_start: int = 0  # data below this is released (not needed by the stream or its forks)
    keep_end: int | None = None  # data from here on is released (soft-deleted sources only)
    soft_deleted: bool = False
    last_access_ms: int = 0
    touch_journaled_ms: int = 0

    @property
    def json(self) -> bool:
        return is_json(self.content_type)

    def expired(self, now_ms: int) -> bool:
        if self.expires_at_ms is not None and now_ms >= self.expires_at_ms:
            return True
        return self.ttl_s is not None and now_ms >= self.last_access_ms + self.ttl_s * 1000


@dataclass(frozen=True, slots=True)
class ForkRequest:
    source_uid: int
    offset: int  # resolved absolute fork point
    spec: str  # canonical description of the fork headers


@dataclass(frozen=True, slots=True)
class CreateRequest:
    content_type: str | None
    ttl_s: int | None
    expires_at: str | None
    expires_at_ms: int | None
    closed: bool
    data: bytes
    fork: ForkRequest | None = None


@dataclass(frozen=True, slots=True)
class AppendRequest:
    content_type: str | None
    data: bytes
    close: bool
    producer: str | None = None
    epoch: int = 0
    seq: int = 0
    stream_seq: str | None = None


@dataclass(frozen=True, slots=True)
class Duplicate:
    """An append already applied earlier: succeed without writing anything."""

    stream: Stream
    epoch: int | None
    seq: int | None


@dataclass(frozen=True, slots=True)
class HotSlice:
    segment: int
    position: int
    length: int


@dataclass(frozen=True, slots=True)
class ColdSlice:
    key: str
    bucket: str
    path: str
    start: int
    end: int


ReadSlice = HotSlice | ColdSlice


class StateExtension(Protocol):
    """Another deterministic state machine that lives in the same journal.

    Subscriptions and consumer groups register one: the journal replays their
    records through ``apply`` and snapshots carry their ``snapshot()`` bytes.
    """

    name: str
    record_types: tuple[type, ...]

    def apply(self, record: Any) -> None: ...

    def snapshot(self) -> bytes: ...

    def restore(self, data: bytes) -> None: ...


class StreamState:
    """All streams and buckets, and the rules that change them."""

    def __init__(self, extensions: Sequence[StateExtension] = ()) -> None:
        self.extensions: dict[str, StateExtension] = {e.name: e for e in extensions}
        self._extension_by_type: dict[type, StateExtension] = {t: e for e in extensions for t in e.record_types}
        self.streams: dict[int, Stream] = {}
        self.paths: dict[tuple[str, str], int] = {}
        self.buckets: dict[str, int] = {DEFAULT_BUCKET: 0}
        self.next_uid = 1
        self.hot_bytes = 0  # bytes that live only in hot segments
        self.cold_objects: dict[str, ColdObject] = {}
        self.copies_in_flight: dict[str, int] = {}  # key -> started ms
        self.children: dict[int, set[int]] = {}  # uid -> uids of live forks of it
        self.erased_buckets: dict[str, int] = {}  # fenced forever: name -> erased at
        self.bucket_retention: dict[str, tuple[int | None, int | None]] = {}  # name -> (ms, bytes)

    # ------------------------------------------------------------- lookups

    def find(self, bucket: str, path: str) -> Stream | None:
        uid = self.paths.get((bucket, path))
        return None if uid is None else self.streams[uid]

    def lookup(self, bucket: str, path: str, now_ms: int) -> Stream:
        """The live stream at a path, or the 404/410 a client should see."""
        s = self.find(bucket, path)
        if s is None or (not s.soft_deleted and s.expired(now_ms)):
            raise StreamError(404, "stream not found")
        if s.soft_deleted:
            raise StreamError(410, "stream was deleted; its data lives on only for its forks")
        return s

    # ------------------------------------------------------------- decide

    def decide_bucket(self, name: str, now_ms: int) -> list[Record]:
        if name in self.erased_buckets:
            raise StreamError(409, f"bucket {name!r} was erased; its name can never be used again")
        if name in self.buckets:
            return []
        return [BucketCreated(name=name, ts_ms=now_ms)]

    def decide_erase_bucket(self, name: str, now_ms: int) -> BucketErased:
        if name == DEFAULT_BUCKET:
            raise StreamError(409, "the default bucket cannot be erased; delete its streams instead")
        if name in self.erased_buckets:
            raise StreamError(410, f"bucket {name!r} was already erased")
        if name not in self.buckets:
            raise StreamError(404, f"bucket {name!r} does not exist")
        return BucketErased(name=name, ts_ms=now_ms)

    def decide_retention_policy(
        self, bucket: str, path: str | None, retention_ms: int | None, retention_bytes: int | None, now_ms: int
    ) -> RetentionPolicySet:
        if bucket not in self.buckets:
            raise StreamError(404, f"bucket {bucket!r} does not exist")
        uid = self.lookup(bucket, path, now_ms).uid if path is not None else None
        return RetentionPolicySet(
            bucket=bucket, uid=uid, retention_ms=retention_ms, retention_bytes=retention_bytes, ts_ms=now_ms
        )

    def decide_retain(self, bucket: str, path: str, offset: int, now_ms: int) -> list[Record]:
        """Advance a stream's earliest retained offset (never backwards)."""
        s = self.lookup(bucket, path, now_ms)
        if offset > s.tail:
            raise StreamError(400, "the retained offset is beyond the stream's tail")
        if s.json:  # a JSON stream's offsets must stay on message boundaries
            offset = self.record_boundary_at_or_before(s, offset)
        if offset <= s.retained_from:
            return []
        return [RetentionAdvanced(ts_ms=now_ms, advances=((s.uid, offset),))]

    def record_boundary_at_or_before(self, s: Stream, offset: int) -> int:
        """The greatest record boundary <= ``offset``: retention never splits a record
        (or a JSON message), so what stays is always whole."""
        if offset >= s.tail:
            return s.tail
        best = s.retained_from
        if s.fork_source is not None and s.fork_offset <= offset:
            best = max(best, s.fork_offset)
        for ref in s.cold_refs:
            for edge in (ref.start, ref.end):
                if best < edge <= offset:
                    best = edge
        c = s.chunks
        i = bisect_right(c.starts, offset) - 1
        if i >= 0:
            best = max(best, c.starts[i])
        return best

    def decide_create(self, bucket: str, path: str, req: CreateRequest, now_ms: int) -> tuple[list[Record], Stream | None]:
        """Records creating the stream, or ``([], existing)`` for an idempotent match."""
        if bucket in self.erased_buckets:
            raise StreamError(409, f"bucket {bucket!r} was erased")
        if bucket not in self.buckets:
            raise StreamError(404, f"bucket {bucket!r} does not exist")
        records: list[Record] = []
        source: Stream | None = None
        if req.fork is not None:
            # Checked first: an expired source is gone, even if it is the stream being replaced.
            source = self.streams.get(req.fork.source_uid)
            if source is None or (not source.soft_deleted and source.expired(now_ms)):
                raise StreamError(404, "fork source stream not found")
            if source.soft_deleted:
                raise StreamError(409, "fork source stream was deleted")
        existing = self.find(bucket, path)
        if existing is not None:
            if existing.soft_deleted:
                raise StreamError(409, "a deleted stream with live forks still holds this path")
            if existing.expired(now_ms):
                records.append(StreamExpired(uid=existing.uid, ts_ms=now_ms))
            else:
                self._check_same_config(existing, req)
                return [], existing
        content_type = req.content_type
        ttl_s, expires_at, expires_at_ms = req.ttl_s, req.expires_at, req.expires_at_ms
        fork_source: int | None = None
        fork_offset = 0
        fork_spec: str | None = None
        if req.fork is not None and source is not None:
            if content_type is None:
                content_type = source.content_type
            elif media_type(content_type) != media_type(source.content_type):
                raise StreamError(409, "a fork's content type must match its source's")
            if not 0 <= req.fork.offset <= source.tail:
                raise StreamError(400, "fork offset is beyond the source stream's tail")
            if ttl_s is None and expires_at_ms is None:
                ttl_s, expires_at, expires_at_ms = source.ttl_s, source.expires_at, source.expires_at_ms
            fork_source, fork_offset, fork_spec = source.uid, req.fork.offset, req.fork.spec
        records.append(
            StreamCreated(
                uid=self.next_uid,
                bucket=bucket,
                path=path,
                content_type=content_type or DEFAULT_CONTENT_TYPE,
                ttl_s=ttl_s,
                expires_at=expires_at,
                expires_at_ms=expires_at_ms,
                closed=req.closed,
                ts_ms=now_ms,
                fork_source=fork_source,
                fork_offset=fork_offset,
                fork_spec=fork_spec,
                data=req.data,
            )
        )
        return records, None

    def _check_same_config(self, s: Stream, req: CreateRequest) -> None:
        wanted_type = req.content_type
        if wanted_type is None:
            wanted_type = s.content_type if req.fork is not None else DEFAULT_CONTENT_TYPE
        same = (
            media_type(wanted_type) == media_type(s.content_type)
            and req.closed == s.closed
            and (req.fork.spec if req.fork else None) == s.fork_spec
        )
        if req.fork is None or req.ttl_s is not None or req.expires_at_ms is not None:
            same = same and req.ttl_s == s.ttl_s and req.expires_at_ms == s.expires_at_ms
        if not same:
            raise StreamError(409, "a stream already exists here with a different configuration")

    def decide_append(self, bucket: str, path: str, req: AppendRequest, now_ms: int) -> Appended | Duplicate:
        s = self.lookup(bucket, path, now_ms)
        if s.closed:
            ident = (req.producer, req.epoch, req.seq) if req.producer is not None else None
            if ident is not None and ident == s.closed_by:
                return Duplicate(s, req.epoch, req.seq)
            if not req.data and req.close:
                return Duplicate(s, None, None)
            raise StreamError(409, "stream is closed", {"Stream-Closed": "true", "Stream-Next-Offset": format_offset(s.tail)})
        if req.data and req.content_type is not None and media_type(req.content_type) != media_type(s.content_type):
            raise StreamError(409, f"content type does not match the stream's ({s.content_type})")
        if req.producer is not None:
            p = s.producers.get(req.producer)
            if p is not None and req.epoch < p.epoch:
                raise StreamError(403, "stale producer epoch", {"Producer-Epoch": str(p.epoch)})
            if p is None or req.epoch > p.epoch:
                if req.seq != 0:
                    raise StreamError(400, "a new producer epoch must start at sequence 0")
            elif req.seq <= p.last_seq:
                return Duplicate(s, p.epoch, p.last_seq)
            elif req.seq > p.last_seq + 1:
                raise StreamError(
                    409,
                    "producer sequence gap",
                    {"Producer-Expected-Seq": str(p.last_seq + 1), "Producer-Received-Seq": str(req.seq)},
                )
        if req.stream_seq is not None and s.stream_seq is not None and req.stream_seq <= s.stream_seq:
            raise StreamError(409, "Stream-Seq must increase")
        return Appended(
            uid=s.uid,
            offset=s.tail,
            ts_ms=now_ms,
            producer=req.producer,
            epoch=req.epoch,
            seq=req.seq,
            stream_seq=req.stream_seq,
            close=req.close,
            data=req.data,
        )

    def decide_delete(self, bucket: str, path: str, now_ms: int) -> StreamDeleted:
        s = self.lookup(bucket, path, now_ms)
        return StreamDeleted(uid=s.uid, ts_ms=now_ms)

    def touch(self, s: Stream, now_ms: int) -> StreamTouched | None:
        """Reset a sliding TTL on access; a record when the journal should learn of it.

        The in-memory time is exact; the journal hears about it at most every
        quarter TTL, so a restart can only move expiry earlier by that much.
        """
        if s.ttl_s is None:
            return None
        s.last_access_ms = max(s.last_access_ms, now_ms)
        if now_ms - s.touch_journaled_ms >= s.ttl_s * 250:
            return StreamTouched(uid=s.uid, ts_ms=now_ms)
        return None

    # ------------------------------------------------------------- apply

    def apply(self, record: Record, location: tuple[int, int] | None = None) -> None:
        """Apply one record. ``location`` is where a record's data lives on disk."""
        if isinstance(record, Appended):
            s = self.streams[record.uid]
            if record.data:
                if location is None:
                    raise ValueError("an append with data needs its location")
                s.chunks.add(record.offset, len(record.data), location[0], location[1], record.ts_ms)
                s.tail = record.offset + len(record.data)
                self.hot_bytes += len(record.data)
            if record.producer is not None:
                s.producers[record.producer] = ProducerState(record.epoch, record.seq)
            if record.stream_seq is not None:
                s.stream_seq = record.stream_seq
            if record.close:
                s.closed = True
                if record.producer is not None:
                    s.closed_by = (record.producer, record.epoch, record.seq)
            s.last_access_ms = max(s.last_access_ms, record.ts_ms)
        elif isinstance(record, StreamCreated):
            s = Stream(
                uid=record.uid,
                bucket=record.bucket,
                path=record.path,
                content_type=record.content_type,
                ttl_s=record.ttl_s,
                expires_at=record.expires_at,
                expires_at_ms=record.expires_at_ms,
                created_ms=record.ts_ms,
                fork_source=record.fork_source,
                fork_offset=record.fork_offset,
                fork_spec=record.fork_spec,
                tail=record.fork_offset,
                cold_end=record.fork_offset,
                closed=record.closed,
                last_access_ms=record.ts_ms,
                touch_journaled_ms=record.ts_ms,
            )
            if record.data:
                if location is None:
                    raise ValueError("a create with data needs its location")
                s.chunks.add(record.fork_offset, len(record.data), location[0], location[1], record.ts_ms)
                s.tail += len(record.data)
                self.hot_bytes += len(record.data)
            self.streams[s.uid] = s
            self.paths[(s.bucket, s.path)] = s.uid
            self.next_uid = max(self.next_uid, s.uid + 1)
            if s.fork_source is not None:
                source = self.streams[s.fork_source]
                source.forks += 1
                self.children.setdefault(s.fork_source, set()).add(s.uid)
                # What the source no longer retains, its fork never had.
                s.retained_from = min(source.retained_from, s.fork_offset)
        elif isinstance(record, (StreamDeleted, StreamExpired)):
            self._delete(self.streams[record.uid], record.ts_ms)
        elif isinstance(record, StreamTouched):
            s = self.streams[record.uid]
            s.last_access_ms = max(s.last_access_ms, record.ts_ms)
            s.touch_journaled_ms = record.ts_ms
        elif isinstance(record, BucketCreated):
            self.buckets.setdefault(record.name, record.ts_ms)
        elif isinstance(record, ColdCopyStarted):
            self.copies_in_flight[record.key] = record.ts_ms
        elif isinstance(record, ColdCopyCommitted):
            self._apply_copy_committed(record)
        elif isinstance(record, ColdCopyAborted):
            self.copies_in_flight.pop(record.key, None)
        elif isinstance(record, HotTrimmed):
            for uid, offset in record.trims:
                trimmed = self.streams.get(uid)
                if trimmed is not None:
                    trimmed.chunks.trim_below(min(offset, trimmed.cold_end))
        elif isinstance(record, RetentionAdvanced):
            for uid, offset in record.advances:
                target = self.streams.get(uid)
                if target is not None and offset > target.retained_from:
                    target.retained_from = min(offset, target.tail)
                    self._release_chain(target, record.ts_ms)
        elif isinstance(record, RetentionPolicySet):
            if record.uid is None:
                self.bucket_retention[record.bucket] = (record.retention_ms, record.retention_bytes)
            elif record.uid in self.streams:
                target = self.streams[record.uid]
                target.retention_ms, target.retention_bytes = record.retention_ms, record.retention_bytes
        elif isinstance(record, BucketErased):
            self._erase_bucket(record.name, record.ts_ms)
        elif isinstance(record, ColdDeleteStarted):
            for key in record.keys:
                obj = self.cold_objects.get(key)
                if obj is not None:
                    obj.deleting = True
        elif isinstance(record, ColdDeleteFinished):
            for key in record.keys:
                obj = self.cold_objects.get(key)
                if obj is not None and obj.refs == 0:
                    del self.cold_objects[key]
        else:
            extension = self._extension_by_type.get(type(record))
            if extension is None:
                raise TypeError(f"no state machine applies {type(record).__name__}")
            extension.apply(record)

    def _apply_copy_committed(self, record: ColdCopyCommitted) -> None:
        self.copies_in_flight.pop(record.key, None)
        obj = self.cold_objects.get(record.key)
        if obj is None:
            obj = ColdObject(record.key, record.size, record.crc32c, record.ts_ms, record.index)
            self.cold_objects[record.key] = obj
        for r in record.ranges:
            s = self.streams.get(r.uid)
            # A range is taken only if it extends the stream's cold prefix exactly;
            # anything else (stream gone, range already cold) leaves it unowned.
            if s is None or r.start != s.cold_end or r.end > s.tail:
                continue
            if s.keep_end is not None and r.start >= s.keep_end:
                continue
            before = self._hot_contribution(s)
            s.cold_refs.append(ColdRef(r.start, r.end, record.key))
            s.cold_end = r.end
            self.hot_bytes += self._hot_contribution(s) - before
            obj.refs += 1
            if s.uid in self.children and s.retained_from > 0:
                self._release(s, record.ts_ms)  # the new range may lie in a gap no reader reaches
        if obj.refs == 0 and obj.released_ms is None:
            obj.released_ms = record.ts_ms

    def referenced_segments(self) -> set[int]:
        """Hot segments some stream still reads from."""
        segs: set[int] = set()
        for s in self.streams.values():
            segs.update(s.chunks.segs)
        return segs

    @staticmethod
    def _hot_contribution(s: Stream) -> int:
        """Bytes of ``s`` held only in the hot tier and still needed."""
        hi = s.tail if s.keep_end is None else min(s.tail, s.keep_end)
        return max(0, hi - max(s.cold_end, s.keep_start))

    def _unref(self, key: str, ts_ms: int) -> None:
        obj = self.cold_objects.get(key)
        if obj is not None:
            obj.refs -= 1
            if obj.refs == 0:
                obj.released_ms = ts_ms

    def needed_range(self, s: Stream) -> tuple[int, int | None]:
        """The part of ``s``'s own data that readers can still reach: [lo, hi).

        A live stream needs everything from its retained offset on; a fork
        needs its source below the fork point, from the fork's own floor. A
        soft-deleted source is needed only for what its forks inherit.
        """
        lo: int | None = None if s.soft_deleted else s.retained_from
        hi: int | None = None
        for child_uid in self.children.get(s.uid, ()):
            child = self.streams[child_uid]
            child_lo, _ = self.needed_range(child)
            if child_lo < child.fork_offset:
                lo = child_lo if lo is None else min(lo, child_lo)
                hi = child.fork_offset if hi is None else max(hi, child.fork_offset)
        if lo is None:  # soft-deleted and no fork needs anything: keep nothing
            return s.tail, s.tail
        return lo, (hi if s.soft_deleted else None)

    def _needed_intervals(self, s: Stream) -> list[tuple[int, int | None]]:
        """The ranges of ``s``'s offsets some reader reaches (None: open-ended)."""
        intervals: list[tuple[int, int | None]] = [] if s.soft_deleted else [(s.retained_from, None)]
        for child_uid in self.children.get(s.uid, ()):
            child = self.streams[child_uid]
            child_lo, _ = self.needed_range(child)
            if child_lo < child.fork_offset:
                intervals.append((child_lo, child.fork_offset))
        return intervals

    def _release(self, s: Stream, ts_ms: int) -> None:
        """Let go of cold references and hot copies outside what ``s`` still needs."""
        lo, hi = self.needed_range(s)
        before = self._hot_contribution(s)
        s.keep_start = max(s.keep_start, lo)
        if hi is not None:
            s.keep_end = hi if s.keep_end is None else min(s.keep_end, hi)
        s.cold_end = max(s.cold_end, s.keep_start)
        needed = self._needed_intervals(s)
        kept: list[ColdRef] = []
        for ref in s.cold_refs:
            outside = ref.end <= s.keep_start or (s.keep_end is not None and ref.start >= s.keep_end)
            # Inside the hull but in a gap no reader reaches (between a fork's
            # inheritance and the source's own retained offset) counts as outside.
            if outside or not any(ref.start < (b if b is not None else ref.end + 1) and ref.end > a for a, b in needed):
                self._unref(ref.key, ts_ms)
            else:
                kept.append(ref)
        s.cold_refs = kept
        s.chunks.trim_below(s.keep_start)
        if s.keep_end is not None:
            s.chunks.trim_from(s.keep_end)
        self.hot_bytes += self._hot_contribution(s) - before

    def _release_chain(self, s: Stream, ts_ms: int) -> None:
        """``s``'s needs changed: release in it and up its fork ancestry."""
        current: Stream | None = s
        while current is not None:
            self._release(current, ts_ms)
            current = self.streams.get(current.fork_source) if current.fork_source is not None else None

    def _delete(self, s: Stream, ts_ms: int) -> None:
        if s.soft_deleted:
            return
        if s.forks > 0:
            s.soft_deleted = True
            self._release_chain(s, ts_ms)
        else:
            self._remove(s, ts_ms)

    def _erase_bucket(self, name: str, ts_ms: int) -> None:
        # Forks are created after their sources: newest first deletes forks first.
        for uid in sorted((u for u, st in self.streams.items() if st.bucket == name), reverse=True):
            target = self.streams.get(uid)
            if target is not None:
                self._delete(target, ts_ms)
        for key in [k for k in self.paths if k[0] == name]:
            del self.paths[key]
        self.buckets.pop(name, None)
        self.bucket_retention.pop(name, None)
        self.erased_buckets[name] = ts_ms

    def _remove(self, s: Stream, ts_ms: int = 0) -> None:
        """Drop a stream; a soft-deleted source whose last fork this was goes too."""
        while True:
            del self.streams[s.uid]
            self.children.pop(s.uid, None)
            self.hot_bytes -= self._hot_contribution(s)
            for ref in s.cold_refs:
                self._unref(ref.key, ts_ms)
            if self.paths.get((s.bucket, s.path)) == s.uid:
                del self.paths[(s.bucket, s.path)]
            if s.fork_source is None:
                return
            source = self.streams[s.fork_source]
            source.forks -= 1
            siblings = self.children.get(source.uid)
            if siblings is not None:
                siblings.discard(s.uid)
            if not (source.soft_deleted and source.forks == 0):
                self._release_chain(source, ts_ms)
                return
            s = source

    # ------------------------------------------------------------- reads

    def plan_read(self, s: Stream, start: int, end: int) -> list[ReadSlice]:
        """Slices covering ``[start, end)`` of a stream, through its fork ancestry."""
        slices: list[ReadSlice] = []
        self._plan(s, start, end, slices)
        return slices

    def _plan(self, s: Stream, start: int, end: int, out: list[ReadSlice]) -> None:
        if start < s.fork_offset and s.fork_source is not None:
            self._plan(self.streams[s.fork_source], start, min(end, s.fork_offset), out)
            start = s.fork_offset
        if start >= end:
            return
        # Hot copies may outlive their cold commit (hot retention); prefer them.
        hot_start = s.chunks.start
        if hot_start is None:
            hot_start = s.tail
        if start < hot_start:
            self._plan_cold(s, start, min(end, hot_start), out)
            start = hot_start
        if start >= end:
            return
        c = s.chunks
        i = bisect_right(c.starts, start) - 1
        if i < 0:
            i = 0
        n = len(c)
        while i < n and c.starts[i] < end:
            cs, cl = c.starts[i], c.lens[i]
            lo = max(start, cs)
            hi = min(end, cs + cl)
            if hi > lo:
                out.append(HotSlice(c.segs[i], c.poss[i] + (lo - cs), hi - lo))
            i += 1

    @staticmethod
    def _plan_cold(s: Stream, start: int, end: int, out: list[ReadSlice]) -> None:
        refs = s.cold_refs
        lo, hi = 0, len(refs)
        while lo < hi:  # first ref ending after start
            mid = (lo + hi) // 2
            if refs[mid].end <= start:
                lo = mid + 1
            else:
                hi = mid
        for ref in refs[lo:]:
            if ref.start >= end:
                break
            out.append(ColdSlice(ref.key, s.bucket, s.path, max(start, ref.start), min(end, ref.end)))
