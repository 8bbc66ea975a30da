"""Stream snapshots: the rules of publishing one, replacing the previous one, and what readers see (pure).

A writer publishes a stream's state at an offset (``PUT`` of the stream with
``?snapshot=<offset>``, ``tiered/api/routes/snapshots.py``); readers fetch it and
bootstrap from it (snapshot, then every message after its offset). Each stream
keeps its newest snapshot (``Stream.snapshot``); the body is a cold object of
its own (``data/<ULID>.snapshot``), owned by the stream like any cold object:
``ColdObject.refs`` counts it, a replaced or deleted snapshot's object is
released and GC deletes it after the grace delay through the journaled delete
lifecycle, and reconciliation sees its key.

Publishing is journaled in two steps around the upload (``snapshot_service``):
a ``ColdCopyStarted`` with no ranges (the intent: a crash leaves a known key,
which the flusher aborts at the next start and reconciliation deletes), the
upload, then ``SnapshotPublished``. The rules here decide both before the
upload (no bytes are stored for a refusal) and again right before the commit
(the stream may have moved while the upload ran).

Offsets: a snapshot at ``offset`` holds the state of every byte below it, so a
bootstrap continues at ``offset`` itself. (YJS-PROTOCOL.md section 5.3 answers
``Stream-Next-Offset: offset + 1`` because its offsets name the last update a
snapshot includes; tiered's, as every Durable Streams offset, name where the next
read starts.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tiered.cold.parquet.chunk_index import ChunkIndex
from tiered.core.errors import ErrorCode, TieredError
from tiered.core.ids import format_offset, parse_offset
from tiered.engine.streams.model import ColdObject, PublishedSnapshot, Stream
from tiered.engine.streams.records import RetentionAdvanced, SnapshotPublished, SnapshotRetentionSet
from tiered.engine.streams.release import unref

if TYPE_CHECKING:
    from tiered.engine.streams.state import StreamState

#: ``offset=<offset>_snapshot``: a snapshot's read URL (YJS-PROTOCOL.md section 5.3).
TOKEN_SUFFIX = "_snapshot"
#: ``offset=snapshot``: where the newest snapshot is (YJS-PROTOCOL.md section 5.2).
DISCOVERY = "snapshot"
DEFAULT_SNAPSHOT_TYPE = "application/octet-stream"


@dataclass(frozen=True, slots=True)
class PublishRequest:
    """A publish, as the route parsed it and the shell measured its body."""

    offset: int
    size: int
    crc32c: int
    digest: str  # SHA-256 of the body, hex
    content_type: str
    if_match: str | None = None  # the ETag of the snapshot this one replaces ("*": any)
    if_none_match: bool = False  # ``If-None-Match: *``: only if the stream has no snapshot yet
    retain: bool = False  # advance the stream's retained offset to this snapshot


def token(snap: PublishedSnapshot) -> str:
    """The ``offset`` value that reads ``snap`` (``<offset>_snapshot``)."""
    return format_offset(snap.offset) + TOKEN_SUFFIX


def parse_token(raw: str) -> int | None:
    """The offset of a ``<offset>_snapshot`` read, None if ``raw`` is not one (or malformed)."""
    if not raw.endswith(TOKEN_SUFFIX):
        return None
    return parse_offset(raw[: -len(TOKEN_SUFFIX)])


def etag(snap: PublishedSnapshot) -> str:
    """The snapshot's identity: its offset and body digest (what ``If-Match`` names)."""
    return f'"{format_offset(snap.offset)}:{snap.digest[:32]}"'


def check_publish(s: Stream, req: PublishRequest, tail: int, max_bytes: int) -> PublishedSnapshot | None:
    """The snapshot already published if ``req`` repeats it (idempotent); None: publish it. Raises a refusal.

    ``tail``: what readers see of the stream (a snapshot never covers bytes not yet durable).
    """
    if req.size > max_bytes:
        raise TieredError(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"a snapshot body is at most {max_bytes} bytes (--stream-snapshot-max-bytes)",
        )
    if req.offset > tail:
        raise TieredError(ErrorCode.OFFSET_BEYOND_TAIL, "the snapshot offset is beyond the stream's tail")
    current = s.snapshot
    if current is not None and current.offset == req.offset:
        if current.digest == req.digest and current.content_type == req.content_type:
            return current  # the same snapshot again: a success that stores nothing
        raise TieredError(
            ErrorCode.SNAPSHOT_CONFLICT,
            "a different snapshot is already published at this offset",
            snapshot_offset=format_offset(current.offset),
        )
    if req.offset < s.retained_from:
        raise TieredError(
            ErrorCode.OFFSET_GONE,
            "the snapshot offset is below the stream's retained offset: its suffix is gone",
            next_offset=format_offset(s.retained_from),
        )
    if req.if_none_match and current is not None:
        raise TieredError(
            ErrorCode.SNAPSHOT_PRECONDITION_FAILED,
            "If-None-Match: * but the stream has a snapshot",
            snapshot_offset=format_offset(current.offset),
        )
    if (
        req.if_match is not None
        and req.if_match != "*"
        and (current is None or etag(current) != req.if_match)
    ):
        raise TieredError(
            ErrorCode.SNAPSHOT_PRECONDITION_FAILED,
            "If-Match does not name the stream's current snapshot",
            **({} if current is None else {"snapshot_offset": format_offset(current.offset)}),
        )
    if req.if_match == "*" and current is None:
        raise TieredError(
            ErrorCode.SNAPSHOT_PRECONDITION_FAILED, "If-Match: * but the stream has no snapshot"
        )
    if current is not None and req.offset < current.offset:
        raise TieredError(
            ErrorCode.SNAPSHOT_STALE,
            "a newer snapshot is already published",
            snapshot_offset=format_offset(current.offset),
        )
    return None


def published_records(
    state: StreamState, s: Stream, req: PublishRequest, key: str, tail: int, max_bytes: int, now_ms: int
) -> list[SnapshotPublished | RetentionAdvanced] | PublishedSnapshot:
    """Right before the commit: the records, or the snapshot a concurrent identical publish already made.

    Retention follows the new snapshot when the publish asks it or ``retain: snapshot`` covers the stream.
    """
    existing = check_publish(s, req, tail, max_bytes)
    if existing is not None:
        return existing
    records: list[SnapshotPublished | RetentionAdvanced] = [
        SnapshotPublished(
            uid=s.uid,
            offset=req.offset,
            key=key,
            size=req.size,
            crc32c=req.crc32c,
            digest=req.digest,
            content_type=req.content_type,
            ts_ms=now_ms,
        )
    ]
    if (req.retain or retains_to_snapshot(state, s)) and req.offset > s.retained_from:
        records.append(RetentionAdvanced(ts_ms=now_ms, advances=((s.uid, req.offset),)))
    return records


def decide_retain_to_snapshot(s: Stream, now_ms: int) -> list[RetentionAdvanced]:
    """Retain ``s`` from its newest snapshot (none: 404). Its offset was checked a message boundary when
    it was published, so retention moves exactly there (not to an earlier record edge, as an arbitrary
    offset of a JSON stream does)."""
    if s.snapshot is None:
        raise TieredError(ErrorCode.SNAPSHOT_NOT_FOUND, "the stream has no snapshot to retain from")
    if s.snapshot.offset <= s.retained_from:
        return []
    return [RetentionAdvanced(ts_ms=now_ms, advances=((s.uid, s.snapshot.offset),))]


def snapshot_at(s: Stream, offset: int) -> PublishedSnapshot:
    """The snapshot an ``<offset>_snapshot`` read names: only the newest is kept (YJS: 404, rediscover)."""
    snap = s.snapshot
    if snap is None or snap.offset != offset:
        raise TieredError(
            ErrorCode.SNAPSHOT_NOT_FOUND,
            "no snapshot at this offset (replaced or never published); read offset=snapshot for the newest",
            **({} if snap is None else {"snapshot_offset": format_offset(snap.offset)}),
        )
    return snap


# ------------------------------------------------------------------ apply


def apply_published(state: StreamState, record: SnapshotPublished) -> None:
    state.copies_in_flight.pop(record.key, None)
    obj = state.cold_objects.get(record.key)
    s = state.streams.get(record.uid)
    if obj is None:
        index = ChunkIndex(file_size=record.size, footer_length=0, row_groups=(), streams=())
        owner = s.bucket if s is not None else None
        obj = ColdObject(record.key, record.size, record.crc32c, record.ts_ms, index, owner_bucket=owner)
        state.cold_objects[record.key] = obj
    if s is None or s.soft_deleted:
        # Gone meanwhile: nobody owns the object, GC deletes it after the grace delay.
        if obj.refs == 0 and obj.released_ms is None:
            obj.released_ms = record.ts_ms
        return
    old = s.snapshot
    s.snapshot = PublishedSnapshot(
        record.offset,
        record.key,
        record.size,
        record.crc32c,
        record.digest,
        record.content_type,
        record.ts_ms,
    )
    obj.refs += 1
    obj.released_ms = None
    if old is not None:
        unref(state, old.key, record.ts_ms)


def retains_to_snapshot(state: StreamState, s: Stream) -> bool:
    """``retain: snapshot`` covers ``s``: set on the stream, or on its bucket."""
    return s.retain_snapshot or s.bucket in state.snapshot_retention


def decide_retention(
    state: StreamState, bucket: str, path: str | None, on: bool, now_ms: int
) -> list[SnapshotRetentionSet | RetentionAdvanced]:
    """``retain: snapshot`` on a bucket (``path`` None) or one of its streams, or off again.

    Turned on, what it covers is retained from its snapshot at once.
    """
    if bucket not in state.buckets:
        raise TieredError(ErrorCode.BUCKET_NOT_FOUND, f"bucket {bucket!r} does not exist")
    covered = [state.lookup(bucket, path, now_ms)] if path is not None else []
    if path is None:
        covered = [s for s in state.streams.values() if s.bucket == bucket and not s.soft_deleted]
    records: list[SnapshotRetentionSet | RetentionAdvanced] = [
        SnapshotRetentionSet(
            bucket=bucket, uid=covered[0].uid if path is not None else None, on=on, ts_ms=now_ms
        )
    ]
    advances = tuple(
        (s.uid, s.snapshot.offset)
        for s in covered
        if on and s.snapshot is not None and s.snapshot.offset > s.retained_from
    )
    if advances:
        records.append(RetentionAdvanced(ts_ms=now_ms, advances=advances))
    return records


def apply_retention_set(state: StreamState, record: SnapshotRetentionSet) -> None:
    if record.uid is None:
        if record.on:
            state.snapshot_retention.add(record.bucket)
        else:
            state.snapshot_retention.discard(record.bucket)
    elif (target := state.streams.get(record.uid)) is not None:
        target.retain_snapshot = record.on


def drop(state: StreamState, s: Stream, ts_ms: int) -> None:
    """``s`` is removed or soft-deleted: no reader reaches its snapshot, whose object is released."""
    if s.snapshot is not None:
        unref(state, s.snapshot.key, ts_ms)
        s.snapshot = None


def snapshot_bytes(s: Stream) -> int:
    """What ``s``'s snapshot counts towards its bucket's retained bytes."""
    return s.snapshot.size if s.snapshot is not None else 0
