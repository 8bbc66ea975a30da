"""The engine's snapshot: the whole ``StreamState`` (extensions included) and the log position it covers.

The journal handles the files (``tiered.engine.journal.snapshot``: framing,
checksums, the newest that verifies); this is their body, composed from the
state machines' own types. ``SNAPSHOTS`` is the codec the journal is given.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from tiered.cold.parquet.chunk_index import ChunkIndex
from tiered.engine.journal.snapshot import frame, unframe
from tiered.engine.streams.model import ColdObject, ColdRef, HotChunks, PathHistory, ProducerState, Stream
from tiered.engine.streams.producers import total_bytes
from tiered.engine.streams.release import hot_contribution
from tiered.engine.streams.state import StreamState
from tiered.hot.log import LogPosition

SNAPSHOT_VERSION = 4
# Version 3 lacks streams' incarnations and paths' histories (their fields decode as defaults:
# every stream its path's first, no history), which is what a data dir of that version knew.
READABLE_VERSIONS = (3, 4)


class StreamSnap(msgspec.Struct, array_like=True):
    uid: int
    bucket: str
    path: str
    content_type: str
    ttl_s: int | None
    expires_at: str | None
    expires_at_ms: int | None
    created_ms: int
    fork_source: int | None
    fork_offset: int
    fork_spec: str | None
    tail: int
    closed: bool
    closed_by: tuple[str, int, int] | None
    # In least-recently-used order: (epoch, last seq, last append ms). Snapshots written before
    # producer expiry hold pairs; their producers count as last seen at the stream's last access.
    producers: dict[str, tuple[int, ...]]
    stream_seq: str | None
    chunks: tuple[bytes, bytes, bytes, bytes, bytes]
    cold_refs: list[tuple[int, int, str]]
    cold_end: int
    forks: int
    retained_from: int
    retention_ms: int | None
    retention_bytes: int | None
    keep_start: int
    keep_end: int | None
    soft_deleted: bool
    last_access_ms: int
    incarnation: int = 0  # version 4


class ColdObjectSnap(msgspec.Struct, array_like=True):
    key: str
    size: int
    crc32c: int
    created_ms: int
    index: ChunkIndex
    released_ms: int | None
    deleting: bool


class StateSnap(msgspec.Struct, array_like=True):
    log_segment: int
    log_offset: int
    next_uid: int
    buckets: dict[str, int]
    streams: list[StreamSnap]
    cold_objects: list[ColdObjectSnap]
    copies_in_flight: dict[str, int]
    paths: list[tuple[str, str, int]]  # which stream holds each path (a soft-deleted one may not)
    extensions: dict[str, bytes]  # StateExtension name -> its own snapshot bytes
    erased_buckets: dict[str, int]
    bucket_retention: dict[str, tuple[int | None, int | None]]
    # Version 4: (bucket, path, incarnations, fence) of paths whose streams were removed.
    path_history: list[tuple[str, str, int, int]] = msgspec.field(default_factory=list)


def _stream_snap(s: Stream) -> StreamSnap:
    c = s.chunks
    return StreamSnap(
        uid=s.uid,
        bucket=s.bucket,
        path=s.path,
        content_type=s.content_type,
        ttl_s=s.ttl_s,
        expires_at=s.expires_at,
        expires_at_ms=s.expires_at_ms,
        created_ms=s.created_ms,
        fork_source=s.fork_source,
        fork_offset=s.fork_offset,
        fork_spec=s.fork_spec,
        tail=s.tail,
        closed=s.closed,
        closed_by=s.closed_by,
        producers={k: (p.epoch, p.last_seq, p.last_ms) for k, p in s.producers.items()},
        stream_seq=s.stream_seq,
        chunks=tuple(a.tobytes() for a in c.arrays()),  # type: ignore[arg-type]
        cold_refs=[(r.start, r.end, r.key) for r in s.cold_refs],
        cold_end=s.cold_end,
        forks=s.forks,
        retained_from=s.retained_from,
        retention_ms=s.retention_ms,
        retention_bytes=s.retention_bytes,
        keep_start=s.keep_start,
        keep_end=s.keep_end,
        soft_deleted=s.soft_deleted,
        last_access_ms=s.last_access_ms,
        incarnation=s.incarnation,
    )


def _stream_from_snap(n: StreamSnap) -> Stream:
    chunks = HotChunks()
    for arr, raw in zip(chunks.arrays(), n.chunks, strict=True):
        arr.frombytes(raw)
    producers = {
        k: ProducerState(p[0], p[1], p[2] if len(p) > 2 else n.last_access_ms) for k, p in n.producers.items()
    }
    return Stream(
        uid=n.uid,
        bucket=n.bucket,
        path=n.path,
        content_type=n.content_type,
        ttl_s=n.ttl_s,
        expires_at=n.expires_at,
        expires_at_ms=n.expires_at_ms,
        created_ms=n.created_ms,
        fork_source=n.fork_source,
        fork_offset=n.fork_offset,
        fork_spec=n.fork_spec,
        tail=n.tail,
        closed=n.closed,
        closed_by=n.closed_by,
        producers=producers,
        producer_bytes=total_bytes(producers),
        stream_seq=n.stream_seq,
        chunks=chunks,
        cold_refs=[ColdRef(a, b, k) for a, b, k in n.cold_refs],
        cold_end=n.cold_end,
        forks=n.forks,
        retained_from=n.retained_from,
        retention_ms=n.retention_ms,
        retention_bytes=n.retention_bytes,
        keep_start=n.keep_start,
        keep_end=n.keep_end,
        soft_deleted=n.soft_deleted,
        last_access_ms=n.last_access_ms,
        touch_journaled_ms=n.last_access_ms,
        incarnation=n.incarnation,
    )


def encode_snapshot(state: StreamState, position: LogPosition) -> bytes:
    snap = StateSnap(
        log_segment=position.segment,
        log_offset=position.offset,
        next_uid=state.next_uid,
        buckets=dict(state.buckets),
        streams=[_stream_snap(s) for s in state.streams.values()],
        cold_objects=[
            ColdObjectSnap(o.key, o.size, o.crc32c, o.created_ms, o.index, o.released_ms, o.deleting)
            for o in state.cold_objects.values()
        ],
        copies_in_flight=dict(state.copies_in_flight),
        paths=[(b, p, uid) for (b, p), uid in state.paths.items()],
        extensions={name: ext.snapshot() for name, ext in state.extensions.items()},
        erased_buckets=dict(state.erased_buckets),
        bucket_retention=dict(state.bucket_retention),
        path_history=[(b, p, h.incarnations, h.fence) for (b, p), h in state.path_history.items()],
    )
    return frame(SNAPSHOT_VERSION, msgspec.msgpack.encode(snap))


def decode_snapshot(
    data: bytes, new_state: Callable[[], StreamState] | None = None
) -> tuple[StreamState, LogPosition]:
    _, body = unframe(data, READABLE_VERSIONS)
    snap = msgspec.msgpack.decode(body, type=StateSnap)
    state = (new_state or StreamState)()
    for name, ext_data in snap.extensions.items():
        if name in state.extensions:
            state.extensions[name].restore(ext_data)
    state.next_uid = snap.next_uid
    state.buckets = dict(snap.buckets)
    for n in snap.streams:
        s = _stream_from_snap(n)
        state.streams[s.uid] = s
        state.hot_bytes += hot_contribution(s)
        if s.fork_source is not None:
            state.children.setdefault(s.fork_source, set()).add(s.uid)
    for o in snap.cold_objects:
        state.cold_objects[o.key] = ColdObject(
            o.key, o.size, o.crc32c, o.created_ms, o.index, released_ms=o.released_ms, deleting=o.deleting
        )
    for s in state.streams.values():  # reference counts are derived, not stored
        for ref in s.cold_refs:
            state.cold_objects[ref.key].refs += 1
    state.copies_in_flight = dict(snap.copies_in_flight)
    state.paths = {(b, p): uid for b, p, uid in snap.paths}
    state.erased_buckets = dict(snap.erased_buckets)
    state.bucket_retention = dict(snap.bucket_retention)
    state.path_history = {(b, p): PathHistory(n, fence) for b, p, n, fence in snap.path_history}
    return state, LogPosition(snap.log_segment, snap.log_offset)


class EngineSnapshots:
    """The ``SnapshotCodec`` of the engine's state (recovery's empty state: a bare ``StreamState``)."""

    def new_state(self) -> StreamState:
        return StreamState()

    def encode(self, state: StreamState, position: LogPosition) -> bytes:
        return encode_snapshot(state, position)

    def decode(
        self, data: bytes, new_state: Callable[[], StreamState] | None = None
    ) -> tuple[StreamState, LogPosition]:
        return decode_snapshot(data, new_state)


SNAPSHOTS = EngineSnapshots()
