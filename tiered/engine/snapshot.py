"""The engine's snapshot: the whole ``StreamState`` (extensions included) and the log position it covers.

The journal handles the files (``tiered.engine.journal.snapshot``: framing,
checksums, the newest that verifies); this is their body. Its streams and
cold objects are the state's own types (``tiered.engine.streams.model``:
msgspec Structs), encoded as they are, so a field added to ``Stream`` is in
snapshots with no edit here; the containers of ``StreamState`` are listed
below. Each extension state machine snapshots itself (``extensions``).
``SNAPSHOTS`` is the codec the journal is given.

Versions: 3 lacks streams' incarnations and paths' histories (they decode as
defaults: every stream its path's first, no history), which is what a data
dir of that version knew; snapshots written before producer expiry hold
(epoch, seq) pairs as producer states (``NOT_RECORDED_MS``). 4 adds them. 5
is 4 with the derived and soft fields of streams and cold objects after the
durable ones, which every version rebuilds on restore, and the extensions'
newer formats. One definition reads all three: each is the next one's
prefix.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from tiered.engine.journal.snapshot import frame, unframe
from tiered.engine.streams.model import (
    NOT_RECORDED_MS,
    ColdObject,
    PathHistory,
    Stream,
    decode_hook,
    encode_hook,
)
from tiered.engine.streams.producers import total_bytes
from tiered.engine.streams.release import hot_contribution
from tiered.engine.streams.state import StreamState
from tiered.hot.log import LogPosition

SNAPSHOT_VERSION = 5
READABLE_VERSIONS = (3, 4, 5)


class StateSnap(msgspec.Struct, array_like=True):
    log_segment: int
    log_offset: int
    next_uid: int
    buckets: dict[str, int]
    streams: list[Stream]
    cold_objects: list[ColdObject]
    copies_in_flight: dict[str, int]
    paths: list[tuple[str, str, int]]  # which stream holds each path (a soft-deleted one may not)
    extensions: dict[str, bytes]  # StateExtension name -> its own snapshot bytes
    erased_buckets: dict[str, int]
    bucket_retention: dict[str, tuple[int | None, int | None]]
    # Version 4: (bucket, path, incarnations, fence) of paths whose streams were removed.
    path_history: list[tuple[str, str, int, int]] = msgspec.field(default_factory=list)
    # Buckets whose retention follows their streams' snapshots (``tiered/engine/streams/snapshots.py``).
    snapshot_retention: list[str] = msgspec.field(default_factory=list)


_encoder = msgspec.msgpack.Encoder(enc_hook=encode_hook)
_decoder = msgspec.msgpack.Decoder(StateSnap, dec_hook=decode_hook)


def encode_body(snap: StateSnap) -> bytes:
    return _encoder.encode(snap)


def decode_body(body: bytes) -> StateSnap:
    return _decoder.decode(body)


def encode_snapshot(state: StreamState, position: LogPosition) -> bytes:
    snap = StateSnap(
        log_segment=position.segment,
        log_offset=position.offset,
        next_uid=state.next_uid,
        buckets=state.buckets,
        streams=list(state.streams.values()),
        cold_objects=list(state.cold_objects.values()),
        copies_in_flight=state.copies_in_flight,
        paths=[(b, p, uid) for (b, p), uid in state.paths.items()],
        extensions={name: ext.snapshot() for name, ext in state.extensions.items()},
        erased_buckets=state.erased_buckets,
        bucket_retention=state.bucket_retention,
        path_history=[(b, p, h.incarnations, h.fence) for (b, p), h in state.path_history.items()],
        snapshot_retention=sorted(state.snapshot_retention),
    )
    return frame(SNAPSHOT_VERSION, encode_body(snap))


def decode_snapshot(
    data: bytes, new_state: Callable[[], StreamState] | None = None
) -> tuple[StreamState, LogPosition]:
    _, body = unframe(data, READABLE_VERSIONS)
    snap = decode_body(body)
    state = (new_state or StreamState)()
    for name, ext_data in snap.extensions.items():
        if name in state.extensions:
            state.extensions[name].restore(ext_data)
    state.next_uid = snap.next_uid
    state.buckets = snap.buckets
    for o in snap.cold_objects:
        o.refs = 0  # derived: counted from the streams below
        state.cold_objects[o.key] = o
    for s in snap.streams:
        _rebuild_derived(s)
        state.streams[s.uid] = s
        state.hot_bytes += hot_contribution(s)
        if s.fork_source is not None:
            state.children.setdefault(s.fork_source, set()).add(s.uid)
        for ref in s.cold_refs:
            state.cold_objects[ref.key].refs += 1
        if s.snapshot is not None:  # a stream snapshot's object is owned by its stream too
            state.cold_objects[s.snapshot.key].refs += 1
        if s.key_index is not None:  # and its key index's (issue 21, ``header_keys``)
            state.cold_objects[s.key_index.key].refs += 1
    state.copies_in_flight = snap.copies_in_flight
    state.paths = {(b, p): uid for b, p, uid in snap.paths}
    state.erased_buckets = snap.erased_buckets
    state.bucket_retention = snap.bucket_retention
    state.path_history = {(b, p): PathHistory(n, fence) for b, p, n, fence in snap.path_history}
    state.snapshot_retention = set(snap.snapshot_retention)
    return state, LogPosition(snap.log_segment, snap.log_offset)


def _rebuild_derived(s: Stream) -> None:
    """What a restore rebuilds rather than reads: producers' cost, the TTL-touch throttle, old producer times."""
    if s.producers:
        for pid, p in s.producers.items():
            if p.last_ms == NOT_RECORDED_MS:  # an (epoch, seq) pair: last seen at the stream's last access
                s.producers[pid] = msgspec.structs.replace(p, last_ms=s.last_access_ms)
        s.producer_bytes = total_bytes(s.producers)
    else:
        s.producer_bytes = 0
    s.touch_journaled_ms = s.last_access_ms


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
