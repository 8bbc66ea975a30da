"""The stream state machine: the deterministic core of the service.

Requests are *decided* against the current state, producing journal records
(or a ``TieredError`` that changes nothing); records are *applied* to move the
state forward. Replay after a restart is just ``apply`` over the journal, so
decide must put everything apply needs (uids, timestamps, offsets) into the
record. Nothing here touches a disk, a socket or a clock: time comes in as
``now_ms``, data locations as opaque ``(segment, position)``.

``StreamState`` holds the data and dispatches; the rules live by concern:

* ``lifecycle``: buckets, create (and forks), delete, expiry, TTL touches, erasure;
* ``appends``: appends, producers (their expiry and cap: ``producers``), closing;
* ``cold_refs``: cold copies, hot trims, object reference counts, deletes;
* ``release``: retention and what no reader can reach any more;
* ``reads``: which hot and cold slices serve a byte range.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, cast

from tiered.core.errors import ErrorCode, TieredError
from tiered.core.ids import DEFAULT_BUCKET
from tiered.engine.streams import (
    appends,
    cold_refs,
    header_keys,
    keyed,
    lifecycle,
    payloads,
    reads,
    release,
    rewrites,
    snapshots,
)
from tiered.engine.streams.model import (
    AppendRequest,
    ColdObject,
    CreateRequest,
    Duplicate,
    PathHistory,
    ReadSlice,
    StateExtension,
    Stream,
    StreamObserver,
)
from tiered.engine.streams.producers import ProducerLimits
from tiered.engine.streams.records import (
    Appended,
    AppendKeyed,
    BucketCreated,
    BucketErased,
    ColdCopyAborted,
    ColdCopyCommitted,
    ColdCopyStarted,
    ColdDeleteFinished,
    ColdDeleteStarted,
    ColdHolesReleased,
    ColdRewriteCommitted,
    HotTrimmed,
    KeyIndexCommitted,
    PayloadAppended,
    ProducersExpired,
    RetentionAdvanced,
    RetentionPolicySet,
    SnapshotPublished,
    SnapshotRetentionSet,
    StreamCompacted,
    StreamCreated,
    StreamDeleted,
    StreamExpired,
    StreamKeyed,
    StreamTouched,
)

Location = tuple[int, int]


class StreamState:
    """All streams and buckets, and the rules that change them."""

    # Not journal state: wiring (which extension applies, or observes, which record type), configuration.
    SOFT_STATE: ClassVar[tuple[str, ...]] = (
        "_extension_by_type",
        "_observers_by_type",
        "_hot_index",
        "producer_limits",
    )

    def __init__(
        self, extensions: Sequence[StateExtension] = (), producer_limits: ProducerLimits | None = None
    ) -> None:
        # Configuration, not journal state: replay under the same limits rebuilds the same producers.
        self.producer_limits = producer_limits or ProducerLimits()
        self.extensions: dict[str, StateExtension] = {e.name: e for e in extensions}
        self._extension_by_type: dict[type, StateExtension] = {
            t: e for e in extensions for t in e.record_types
        }
        # Extensions that also see some stream records, right after they are applied (usage counters).
        self._observers_by_type: dict[type, list[StreamObserver]] = {}
        for e in extensions:
            for t in getattr(e, "observed_types", ()):
                self._observers_by_type.setdefault(t, []).append(cast(StreamObserver, e))
        self.streams: dict[int, Stream] = {}
        self.paths: dict[tuple[str, str], int] = {}
        # Paths whose streams were removed (deleted, expired): what the next stream there must not
        # reuse. Kept for good (one small entry per such path); an erased bucket's go with it.
        self.path_history: dict[tuple[str, str], PathHistory] = {}
        self.buckets: dict[str, int] = {DEFAULT_BUCKET: 0}
        self.next_uid = 1
        self.hot_bytes = 0  # bytes that live only in hot segments
        self.cold_objects: dict[str, ColdObject] = {}
        self.copies_in_flight: dict[str, int] = {}  # key -> started ms
        self.children: dict[int, set[int]] = {}  # uid -> uids of live forks of it
        self.erased_buckets: dict[str, int] = {}  # fenced forever: name -> erased at
        self.bucket_retention: dict[str, tuple[int | None, int | None]] = {}  # name -> (ms, bytes)
        self.snapshot_retention: set[str] = set()  # buckets with ``retain: snapshot`` (``snapshots``)
        # Derived, not journal state: uids that may hold hot chunks (built on first use, so a
        # state decoded from a snapshot builds it once); see hot_resident().
        self._hot_index: set[int] | None = None

    # ------------------------------------------------------------- lookups

    def find(self, bucket: str, path: str) -> Stream | None:
        uid = self.paths.get((bucket, path))
        return None if uid is None else self.streams[uid]

    def lookup(self, bucket: str, path: str, now_ms: int) -> Stream:
        """The live stream at a path, or the error a client should see (404, or 410 if soft-deleted)."""
        s = self.find(bucket, path)
        if s is None or (not s.soft_deleted and s.expired(now_ms)):
            raise TieredError(ErrorCode.STREAM_NOT_FOUND, "stream not found")
        if s.soft_deleted:
            raise TieredError(
                ErrorCode.STREAM_DELETED, "stream was deleted; its data lives on only for its forks"
            )
        return s

    def live_streams(self, bucket: str, now_ms: int) -> int:
        """How many streams of a bucket a client can read."""
        return sum(
            1
            for s in self.streams.values()
            if s.bucket == bucket and not s.soft_deleted and not s.expired(now_ms)
        )

    # ------------------------------------------------------------- decide (see the rule modules)

    def decide_bucket(self, name: str, now_ms: int) -> list[BucketCreated]:
        return lifecycle.decide_bucket(self, name, now_ms)

    def decide_erase_bucket(self, name: str, now_ms: int) -> BucketErased:
        return lifecycle.decide_erase_bucket(self, name, now_ms)

    def decide_create(
        self, bucket: str, path: str, req: CreateRequest, now_ms: int
    ) -> tuple[list[Any], Stream | None]:
        return lifecycle.decide_create(self, bucket, path, req, now_ms)

    def decide_delete(self, bucket: str, path: str, now_ms: int) -> StreamDeleted:
        return lifecycle.decide_delete(self, bucket, path, now_ms)

    def touch(self, s: Stream, now_ms: int) -> StreamTouched | None:
        return lifecycle.touch(s, now_ms)

    def decide_append(self, bucket: str, path: str, req: AppendRequest, now_ms: int) -> Appended | Duplicate:
        return appends.decide_append(self, bucket, path, req, now_ms)

    def decide_retention_policy(
        self,
        bucket: str,
        path: str | None,
        retention_ms: int | None,
        retention_bytes: int | None,
        now_ms: int,
    ) -> RetentionPolicySet:
        return release.decide_retention_policy(self, bucket, path, retention_ms, retention_bytes, now_ms)

    def decide_retain(self, bucket: str, path: str, offset: int, now_ms: int) -> list[RetentionAdvanced]:
        return release.decide_retain(self, bucket, path, offset, now_ms)

    def plan_read(self, s: Stream, start: int, end: int) -> list[ReadSlice]:
        return reads.plan_read(self, s, start, end)

    def note_hot(self, uid: int) -> None:
        """A stream gained hot chunks (called by the apply rules that add them)."""
        if self._hot_index is not None:
            self._hot_index.add(uid)

    def hot_resident(self) -> list[Stream]:
        """Streams that hold hot chunks, by uid: all that flushing, trimming and the segment reaper need.

        Each of those passes runs every second on the event loop; scanning every stream made append
        p99 grow with the number of idle streams (1.7 s at a million, docs/cost-curves.md). Streams
        whose chunks are gone drop out here, lazily.
        """
        index = self._hot_index
        if index is None:
            index = self._hot_index = {uid for uid, s in self.streams.items() if len(s.chunks.starts)}
        out: list[Stream] = []
        gone: list[int] = []
        for uid in sorted(index):
            s = self.streams.get(uid)
            if s is None or not len(s.chunks.starts):
                gone.append(uid)
            else:
                out.append(s)
        index.difference_update(gone)
        return out

    def referenced_segments(self) -> set[int]:
        return cold_refs.referenced_segments(self)

    # ------------------------------------------------------------- apply

    def apply(self, record: Any, location: Location | None = None) -> None:
        """Apply one record. ``location`` is where a record's data lives on disk."""
        handler = _APPLY.get(type(record))
        if handler is not None:
            handler(self, record, location)
            observers = self._observers_by_type.get(type(record))
            if observers is not None:
                for observer in observers:
                    observer.observe(record, self)
            return
        extension = self._extension_by_type.get(type(record))
        if extension is None:
            raise TypeError(f"no state machine applies {type(record).__name__}")
        extension.apply(record)


_APPLY: dict[type, Callable[[StreamState, Any, Location | None], None]] = {
    Appended: appends.apply_appended,
    StreamCreated: lifecycle.apply_created,
    StreamDeleted: lambda st, r, _: lifecycle.apply_gone(st, r.uid, r.ts_ms),
    StreamExpired: lambda st, r, _: lifecycle.apply_gone(st, r.uid, r.ts_ms),
    ProducersExpired: lambda st, r, _: appends.apply_producers_expired(st, r),
    StreamTouched: lambda st, r, _: lifecycle.apply_touched(st, r),
    BucketCreated: lambda st, r, _: lifecycle.apply_bucket_created(st, r),
    BucketErased: lambda st, r, _: lifecycle.apply_bucket_erased(st, r.name, r.ts_ms),
    ColdCopyStarted: lambda st, r, _: cold_refs.apply_copy_started(st, r),
    ColdCopyCommitted: lambda st, r, _: cold_refs.apply_copy_committed(st, r),
    ColdCopyAborted: lambda st, r, _: cold_refs.apply_copy_aborted(st, r),
    HotTrimmed: lambda st, r, _: cold_refs.apply_hot_trimmed(st, r),
    ColdDeleteStarted: lambda st, r, _: cold_refs.apply_delete_started(st, r),
    ColdDeleteFinished: lambda st, r, _: cold_refs.apply_delete_finished(st, r),
    RetentionAdvanced: lambda st, r, _: release.apply_retention_advanced(st, r),
    RetentionPolicySet: lambda st, r, _: release.apply_policy_set(st, r),
    SnapshotPublished: lambda st, r, _: snapshots.apply_published(st, r),
    SnapshotRetentionSet: lambda st, r, _: snapshots.apply_retention_set(st, r),
    ColdRewriteCommitted: lambda st, r, _: rewrites.apply_rewrite_committed(st, r),
    PayloadAppended: payloads.apply_payload_appended,  # large bodies stored by reference
    StreamCompacted: lambda st, r, _: keyed.apply_compacted(st, r),  # keyed compaction (issue 21)
    StreamKeyed: lambda st, r, _: keyed.apply_keyed(st, r),
    ColdHolesReleased: lambda st, r, _: rewrites.apply_holes_released(st, r),  # physical compaction
    AppendKeyed: lambda st, r, _: header_keys.apply_append_keyed(st, r),  # keys by header (issue 21)
    KeyIndexCommitted: lambda st, r, _: header_keys.apply_index_committed(st, r),
}
