"""Lifecycle rules: buckets, creating streams (and forks), deleting, expiring, TTL touches, erasure.

Pure functions of ``StreamState`` (see ``state``): ``decide_*`` return records
or raise ``TieredError`` having changed nothing; ``apply_*`` move the state.

Offsets are never reused at a path (protocol section 4). When a stream leaves
its path (deleted, expired, its bucket erased), the path's ``PathHistory``
keeps how many streams it held and the highest offset they issued (the
*fence*: the last stream's final tail, which readers were given as their next
offset). The next stream there is its next *incarnation*: a plain stream
starts one above the fence (``StreamCreated.fork_offset`` carries it, so
replay needs nothing else); a fork keeps its source's offsets, so it may take
the path only if it serves none at or below the fence (``PATH_OFFSETS_USED``
otherwise). Old offsets are then below everything the new stream serves: reads
answer them 410, never with the new stream's bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tiered.core.content import DEFAULT_CONTENT_TYPE, media_type
from tiered.core.errors import ErrorCode, TieredError
from tiered.core.ids import DEFAULT_BUCKET, format_offset
from tiered.engine.streams import header_keys, integrity, release, snapshots
from tiered.engine.streams.model import CreateRequest, PathHistory, Stream
from tiered.engine.streams.records import (
    BucketCreated,
    BucketErased,
    StreamCreated,
    StreamDeleted,
    StreamExpired,
    StreamTouched,
)

if TYPE_CHECKING:
    from tiered.engine.streams.state import Location, StreamState


# ------------------------------------------------------------------ buckets


def decide_bucket(state: StreamState, name: str, now_ms: int) -> list[BucketCreated]:
    if name in state.erased_buckets:
        raise TieredError(
            ErrorCode.BUCKET_ERASED, f"bucket {name!r} was erased; its name can never be used again"
        )
    if name in state.buckets:
        return []
    return [BucketCreated(name=name, ts_ms=now_ms)]


def decide_erase_bucket(state: StreamState, name: str, now_ms: int) -> BucketErased:
    if name == DEFAULT_BUCKET:
        raise TieredError(
            ErrorCode.DEFAULT_BUCKET_PROTECTED,
            "the default bucket cannot be erased; delete its streams instead",
        )
    if name in state.erased_buckets:
        raise TieredError(ErrorCode.BUCKET_ALREADY_ERASED, f"bucket {name!r} was already erased")
    if name not in state.buckets:
        raise TieredError(ErrorCode.BUCKET_NOT_FOUND, f"bucket {name!r} does not exist")
    return BucketErased(name=name, ts_ms=now_ms)


def check_bucket(state: StreamState, bucket: str) -> None:
    if bucket in state.erased_buckets:
        raise TieredError(ErrorCode.BUCKET_ERASED, f"bucket {bucket!r} was erased")
    if bucket not in state.buckets:
        raise TieredError(ErrorCode.BUCKET_NOT_FOUND, f"bucket {bucket!r} does not exist")


# ------------------------------------------------------------------ create


def fork_source(state: StreamState, source: Stream | None, now_ms: int) -> Stream:
    """The stream a fork reads from, or why it cannot: gone (404) or deleted (409)."""
    if source is None or (not source.soft_deleted and source.expired(now_ms)):
        raise TieredError(ErrorCode.FORK_SOURCE_NOT_FOUND, "fork source stream not found")
    if source.soft_deleted:
        raise TieredError(ErrorCode.FORK_SOURCE_DELETED, "fork source stream was deleted")
    return source


def first_offset(state: StreamState, s: Stream) -> int:
    """The lowest offset ``s`` ever had: its own first one, or (a fork) its ancestry's root's."""
    while s.fork_source is not None:
        s = state.streams[s.fork_source]
    return s.fork_offset


def path_fence(state: StreamState, bucket: str, path: str, replaced: Stream | None = None) -> int | None:
    """The highest offset earlier streams at the path issued (None: there were none).

    ``replaced``: a stream still holding the path that the same create expires.
    """
    history = state.path_history.get((bucket, path))
    fence = history.fence if history is not None else None
    if replaced is not None:
        fence = replaced.tail if fence is None else max(fence, replaced.tail)
    return fence


def earlier_offset(state: StreamState, s: Stream, offset: int) -> bool:
    """Whether ``offset`` is one an earlier stream at ``s``'s path issued (or below any ``s`` had)."""
    fence = path_fence(state, s.bucket, s.path)
    return offset < first_offset(state, s) or (fence is not None and offset <= fence)


def check_fork_offset(state: StreamState, source: Stream, offset: int) -> None:
    """A fork point must be an offset of the source: not below its first one, not beyond its tail."""
    if offset < first_offset(state, source):
        fence = path_fence(state, source.bucket, source.path)
        whose = (
            "it belongs to an earlier stream at that path (deleted or expired, then created again)"
            if fence is not None and offset <= fence
            else "the source never had it"
        )
        raise TieredError(
            ErrorCode.BAD_REQUEST, f"Stream-Fork-Offset is below the source stream's first offset: {whose}"
        )
    if offset > source.tail:
        raise TieredError(ErrorCode.OFFSET_BEYOND_TAIL, "fork offset is beyond the source stream's tail")


def decide_create(
    state: StreamState, bucket: str, path: str, req: CreateRequest, now_ms: int
) -> tuple[list[StreamExpired | StreamCreated], Stream | None]:
    """Records creating the stream, or ``([], existing)`` for an idempotent match."""
    check_bucket(state, bucket)
    if req.expires_at_ms is not None and req.expires_at_ms <= now_ms:
        raise TieredError(ErrorCode.BAD_REQUEST, "Stream-Expires-At is in the past")
    records: list[StreamExpired | StreamCreated] = []
    source: Stream | None = None
    if req.fork is not None and req.fork.source_uid is not None:
        # Checked first: an expired source is gone, even if it is the stream being replaced.
        source = fork_source(state, state.streams.get(req.fork.source_uid), now_ms)
    existing = state.find(bucket, path)
    if existing is not None:
        if existing.soft_deleted:
            raise TieredError(
                ErrorCode.STREAM_EXISTS, "a deleted stream with live forks still holds this path"
            )
        if existing.expired(now_ms):
            records.append(StreamExpired(uid=existing.uid, ts_ms=now_ms))
        else:
            _check_same_config(existing, req)
            return [], existing
    fence = path_fence(state, bucket, path, existing)
    content_type = req.content_type
    ttl_s, expires_at, expires_at_ms = req.ttl_s, req.expires_at, req.expires_at_ms
    fork_source_uid: int | None = None
    fork_offset = 0 if fence is None else fence + 1  # above every offset an earlier stream here issued
    fork_spec: str | None = None
    lowest = fork_offset  # the lowest offset the new stream will serve
    if req.fork is not None and source is not None:
        if content_type is None:
            content_type = source.content_type
        elif media_type(content_type) != media_type(source.content_type):
            raise TieredError(
                ErrorCode.CONTENT_TYPE_MISMATCH, "a fork's content type must match its source's"
            )
        check_fork_offset(state, source, req.fork.offset)
        if ttl_s is None and expires_at_ms is None:
            ttl_s, expires_at, expires_at_ms = source.ttl_s, source.expires_at, source.expires_at_ms
        fork_source_uid, fork_offset, fork_spec = source.uid, req.fork.offset, req.fork.spec
        lowest = min(source.retained_from, fork_offset)  # as ``apply_created`` sets its retained offset
    data = req.data
    if req.fork is not None and req.fork.source_uid is None:
        copy = req.fork.copy
        if copy is None:  # the live stream that held the path when the fork was resolved is gone
            raise TieredError(ErrorCode.UNAVAILABLE, "the fork's path changed while it was created; retry")
        content_type = content_type or copy.content_type
        if ttl_s is None and expires_at_ms is None:
            ttl_s, expires_at, expires_at_ms = copy.ttl_s, copy.expires_at, copy.expires_at_ms
        # A copy: the inherited bytes are the fork's own data, at the offsets they had in the source.
        fork_offset, fork_spec, data = copy.base_from, req.fork.spec, copy.base + req.data
        lowest = fork_offset
    if fence is not None and lowest <= fence:
        # A fork serves its source's offsets: here it would serve some an earlier stream issued.
        raise TieredError(
            ErrorCode.PATH_OFFSETS_USED,
            f"an earlier stream at this path issued offsets up to {format_offset(fence)}, and a fork "
            "here would serve some of them again (a fork keeps its source's offsets); fork to another "
            "path, or create a plain stream here",
            fence=format_offset(fence),
        )
    records.append(
        StreamCreated(
            uid=state.next_uid,
            bucket=bucket,
            path=path,
            content_type=content_type or DEFAULT_CONTENT_TYPE,
            ttl_s=ttl_s,
            expires_at=expires_at,
            expires_at_ms=expires_at_ms,
            closed=req.closed,
            ts_ms=now_ms,
            fork_source=fork_source_uid,
            fork_offset=fork_offset,
            fork_spec=fork_spec,
            data=data,
        )
    )
    return records, None


def _check_same_config(s: Stream, req: CreateRequest) -> None:
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
        raise TieredError(
            ErrorCode.STREAM_EXISTS, "a stream already exists here with a different configuration"
        )


def apply_created(state: StreamState, record: StreamCreated, location: Location | None) -> None:
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
    held = state.paths.get((s.bucket, s.path))
    if held is not None:
        # An expired stream that forks still read (soft-deleted by this create's expiry record) gives
        # up its path now, not when its last fork goes.
        _leave_history(state, state.streams[held])
    history = state.path_history.get((s.bucket, s.path))
    if history is not None:
        s.incarnation = history.incarnations
    integrity.fresh(s)
    if record.data:
        if location is None:
            raise ValueError("a create with data needs its location")
        s.chunks.add(record.fork_offset, len(record.data), location[0], location[1], record.ts_ms)
        s.tail += len(record.data)
        state.note_hot(s.uid)
        state.hot_bytes += len(record.data)
        integrity.note_record(s, record.fork_offset, record.data)
    state.streams[s.uid] = s
    state.paths[(s.bucket, s.path)] = s.uid
    state.next_uid = max(state.next_uid, s.uid + 1)
    if s.fork_source is None:
        # A fork copied from another shard below its retained offset: nothing before its first byte.
        s.retained_from = s.fork_offset
    else:
        source = state.streams[s.fork_source]
        source.forks += 1
        state.children.setdefault(s.fork_source, set()).add(s.uid)
        # What the source no longer retains, its fork never had.
        s.retained_from = min(source.retained_from, s.fork_offset)
        # Nor what keyed compaction removed below the fork point (its bytes may be gone from storage).
        s.holes = tuple((a, min(b, s.fork_offset)) for a, b in source.holes if a < s.fork_offset)


# ------------------------------------------------------------------ touch, delete, expire, erase


def touch(s: Stream, now_ms: int) -> StreamTouched | None:
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


def apply_touched(state: StreamState, record: StreamTouched) -> None:
    s = state.streams[record.uid]
    s.last_access_ms = max(s.last_access_ms, record.ts_ms)
    s.touch_journaled_ms = record.ts_ms


def decide_delete(state: StreamState, bucket: str, path: str, now_ms: int) -> StreamDeleted:
    s = state.lookup(bucket, path, now_ms)
    return StreamDeleted(uid=s.uid, ts_ms=now_ms)


def apply_gone(state: StreamState, uid: int, ts_ms: int) -> None:
    """A delete or expiry: a stream with live forks is soft-deleted, others removed."""
    s = state.streams[uid]
    if s.soft_deleted:
        return
    snapshots.drop(state, s, ts_ms)  # nobody reads the stream's snapshot any more
    header_keys.drop(state, s, ts_ms)  # nor its key index (issue 21)
    if s.forks > 0:
        s.soft_deleted = True
        s.producers.clear()  # nobody appends to it again: its producer states hold nothing
        s.producer_bytes = 0
        release.release_chain(state, s, ts_ms)
    else:
        _remove(state, s, ts_ms)


def apply_bucket_created(state: StreamState, record: BucketCreated) -> None:
    state.buckets.setdefault(record.name, record.ts_ms)


def apply_bucket_erased(state: StreamState, name: str, ts_ms: int) -> None:
    # Forks are created after their sources: newest first deletes forks first.
    for uid in sorted((u for u, st in state.streams.items() if st.bucket == name), reverse=True):
        if uid in state.streams:
            apply_gone(state, uid, ts_ms)
    for key in [k for k in state.paths if k[0] == name]:
        del state.paths[key]
    # The name is fenced forever: no stream will be created at its paths again.
    for key in [k for k in state.path_history if k[0] == name]:
        del state.path_history[key]
    state.buckets.pop(name, None)
    state.bucket_retention.pop(name, None)
    state.erased_buckets[name] = ts_ms


def _remove(state: StreamState, s: Stream, ts_ms: int) -> None:
    """Drop a stream; a soft-deleted source whose last fork this was goes too."""
    while True:
        del state.streams[s.uid]
        state.children.pop(s.uid, None)
        state.hot_bytes -= release.hot_contribution(s)
        for ref in s.cold_refs:
            release.unref(state, ref.key, ts_ms)
        if state.paths.get((s.bucket, s.path)) == s.uid:
            del state.paths[(s.bucket, s.path)]
            _leave_history(state, s)
        if s.fork_source is None:
            return
        source = state.streams[s.fork_source]
        source.forks -= 1
        siblings = state.children.get(source.uid)
        if siblings is not None:
            siblings.discard(s.uid)
            if not siblings:
                del state.children[source.uid]  # as a snapshot would rebuild it: no entry, not an empty one
        if not (source.soft_deleted and source.forks == 0):
            release.release_chain(state, source, ts_ms)
            return
        s = source


def _leave_history(state: StreamState, s: Stream) -> None:
    """``s`` left its path: the next stream there is one incarnation on and serves no offset of it."""
    key = (s.bucket, s.path)
    before = state.path_history.get(key)
    fence = s.tail if before is None else max(before.fence, s.tail)
    state.path_history[key] = PathHistory(s.incarnation + 1, fence)
