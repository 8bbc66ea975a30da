"""Journal records of streams, buckets, the cold tier and GC: the events ``StreamState`` applies.

The metadata journal is the system's source of truth. Every change to stream
state is one of these records, msgpack-encoded with a versioned tag
(``name.vN``) so old journals stay readable when a record gains a version
(``tiered.engine.codec`` puts every feature's records in one union).
Records that carry stream bytes put them in the last field: msgpack stores a
``bin`` value raw at the end of the body, so the payload's position on disk is
``body_end - len(data)`` and reads can ``pread`` it without decoding.
"""

from __future__ import annotations

import msgspec

from tiered.cold.objects.payload import PayloadDigest
from tiered.cold.parquet.chunk_index import ChunkIndex


class _Record(msgspec.Struct, array_like=True, frozen=True, tag_field="t"):
    pass


class BucketCreated(_Record, frozen=True, tag="bucket.create.v1"):
    name: str
    ts_ms: int


class StreamCreated(_Record, frozen=True, tag="stream.create.v1"):
    uid: int
    bucket: str
    path: str
    content_type: str
    ttl_s: int | None
    expires_at: str | None  # as the client sent it, echoed back verbatim
    expires_at_ms: int | None
    closed: bool
    ts_ms: int
    fork_source: int | None  # uid of the source stream
    # Where the stream's own data begins: a fork's fork point; a plain stream's first offset (0, or
    # above every offset its path issued before when the path held a stream already: ``lifecycle``).
    fork_offset: int
    fork_spec: str | None  # the fork headers as requested, for idempotent re-creation
    data: bytes


class Appended(_Record, frozen=True, tag="append.v1"):
    uid: int
    offset: int  # stream position of data[0]
    ts_ms: int
    producer: str | None
    epoch: int
    seq: int
    stream_seq: str | None
    close: bool  # close the stream after this (possibly empty) append
    data: bytes

    @property
    def length(self) -> int:
        """How many stream bytes the append adds (a ``PayloadAppended`` holds them in an object)."""
        return len(self.data)


class StreamDeleted(_Record, frozen=True, tag="delete.v1"):
    uid: int
    ts_ms: int


class StreamTouched(_Record, frozen=True, tag="touch.v1"):
    """A read reset a sliding TTL; journaled lazily so restarts keep it."""

    uid: int
    ts_ms: int


class StreamExpired(_Record, frozen=True, tag="expire.v1"):
    uid: int
    ts_ms: int


class ProducersExpired(_Record, frozen=True, tag="producers.expire.v1"):
    """GC: these streams drop the producer states idle past the producer TTL at ``ts_ms``.

    Appends drop their stream's expired states as they apply; this reaches
    streams nobody appends to any more, so what they held is released.
    """

    ts_ms: int
    uids: tuple[int, ...]


class CopyRange(msgspec.Struct, array_like=True, frozen=True):
    """A stream's byte range ``[start, end)`` that a cold object holds."""

    uid: int
    start: int
    end: int


class DroppedRows(msgspec.Struct, array_like=True, frozen=True):
    """Records of stream ``uid``'s range starting at ``start`` that a compaction rewrite did not copy.

    Every one lies in the stream's holes (``keyed``); ``digest`` (32 bytes, big-endian) is the sum of
    their integrity contributions, ``records`` and ``size`` their count and bytes: they are released.
    """

    uid: int
    start: int
    digest: bytes
    records: int
    size: int


class ColdCopyStarted(_Record, frozen=True, tag="cold.copy-start.v1"):
    """Intent, journaled before the upload: a crash leaves a known orphan key."""

    key: str
    ts_ms: int
    ranges: tuple[CopyRange, ...]


class ColdCopyCommitted(_Record, frozen=True, tag="cold.copy-finish.v1"):
    """The object is durably uploaded: its ranges are now served from it."""

    key: str
    ts_ms: int
    size: int
    crc32c: int  # of the whole object, so verification catches any flipped byte
    index: ChunkIndex
    ranges: tuple[CopyRange, ...]


class ColdCopyAborted(_Record, frozen=True, tag="cold.copy-abort.v1"):
    """The upload will not be committed; the key (if written) is an orphan."""

    key: str
    ts_ms: int
    reason: str


class HotTrimmed(_Record, frozen=True, tag="hot.trim.v1"):
    """Hot copies below each offset are no longer needed (they are cold)."""

    ts_ms: int
    trims: tuple[tuple[int, int], ...]  # (uid, offset)


class BucketErased(_Record, frozen=True, tag="bucket.erase.v1"):
    """Every stream of the bucket is gone and the name is fenced forever."""

    name: str
    ts_ms: int


class RetentionPolicySet(_Record, frozen=True, tag="retention.policy.v1"):
    """Age/size retention for a bucket (uid None) or one stream; None clears a limit."""

    bucket: str
    uid: int | None
    retention_ms: int | None
    retention_bytes: int | None
    ts_ms: int


class RetentionAdvanced(_Record, frozen=True, tag="retention.advance.v1"):
    """Streams' earliest retained offsets move forward; data below is released."""

    ts_ms: int
    advances: tuple[tuple[int, int], ...]  # (uid, new retained offset)


class ColdDeleteStarted(_Record, frozen=True, tag="cold.delete-start.v1"):
    """Journaled before the object-store delete (orphans: keys the metadata never knew)."""

    keys: tuple[str, ...]
    ts_ms: int
    orphan: bool


class ColdDeleteFinished(_Record, frozen=True, tag="cold.delete-finish.v1"):
    keys: tuple[str, ...]
    ts_ms: int
    orphan: bool


class SnapshotPublished(_Record, frozen=True, tag="stream.snapshot.v1"):
    """A stream snapshot's object is uploaded (its intent: a ``ColdCopyStarted`` with no ranges): now the newest.

    Replaces the stream's previous snapshot (its object released to GC). When
    retention follows it (asked, or ``retain: snapshot``), a ``RetentionAdvanced``
    to ``offset`` is committed with it, so every observer of retention sees it.
    """

    uid: int
    offset: int
    key: str
    size: int
    crc32c: int
    digest: str
    content_type: str
    ts_ms: int


class SnapshotRetentionSet(_Record, frozen=True, tag="snapshot.retention.v1"):
    """``retain: snapshot`` on a bucket (uid None) or one stream: retention follows the newest snapshot.

    Turned on, every stream it covers that has a snapshot is retained from it at once (a
    ``RetentionAdvanced`` committed with it).
    """

    bucket: str
    uid: int | None
    on: bool
    ts_ms: int


class ColdRewriteCommitted(_Record, frozen=True, tag="cold.rewrite.v1"):
    """A rewritten copy of ``old_key`` is durably uploaded as ``new_key``: ``ranges`` now read from it.

    The rewrite job (``tiered.engine.jobs.rewrite``) journals ``ColdCopyStarted(new_key, ())``
    before the upload and this after it. Applying it moves each listed stream range
    that still reads from ``old_key`` (exactly that range) to ``new_key``; a range
    released meanwhile stays released. The old object loses those owners and, once
    it has none, goes through the GC's grace delay and journaled delete.

    ``dropped`` (absent before physical compaction): per moved range, the records in
    the stream's holes that the new object no longer holds; they are released with
    the move (the live digest follows storage), and only if the range moved.
    """

    old_key: str
    new_key: str
    ts_ms: int
    size: int
    crc32c: int
    index: ChunkIndex
    ranges: tuple[CopyRange, ...]
    dropped: tuple[DroppedRows, ...] = ()


class StreamKeyed(_Record, frozen=True, tag="stream.keyed.v1"):
    """The stream ``uid`` just created is keyed by the JSON pointer ``compaction_key`` (``keyed``).

    Journaled right after its ``StreamCreated``, in the same batch (a create's
    data must end its record, so the key cannot follow it there).
    """

    uid: int
    compaction_key: str


class StreamCompacted(_Record, frozen=True, tag="stream.compact.v1"):
    """Keyed compaction (``tiered.gc.compaction``): the messages in ``removed`` are no longer served.

    One record per stream per pass, so a range is compacted all at once or not
    at all. Offsets stay: reads skip the removed ranges (``Stream.holes``).
    """

    uid: int
    ts_ms: int
    removed: tuple[tuple[int, int], ...]


class PayloadAppended(Appended, frozen=True, tag="append.payload.v1"):
    """A large body stored by reference (``payloads``): an append whose bytes are the object ``key``.

    ``data`` is empty; the body was streamed to ``key`` (journaled first as a
    ``ColdCopyStarted`` intent) and ``digest`` checks every byte read back.
    ``record_hash`` is the body's integrity digest contribution (``integrity``).
    Applying it makes ``key`` a cold object the stream references for
    ``[offset, offset + digest.size)``, released like any other.
    """

    key: str
    digest: PayloadDigest
    # Its integrity digest contribution (``tiered.core.record_digest``, 32 bytes big-endian), hashed as
    # the body streamed; empty from a stream without digests, or journaled before payloads were counted.
    record_hash: bytes = b""

    @property
    def length(self) -> int:
        return self.digest.size


class ColdHolesReleased(_Record, frozen=True, tag="cold.holes-release.v1"):
    """Stream ranges that lie wholly in their stream's holes (keyed compaction) stop reading ``old_key``.

    Journaled by a compaction rewrite (``tiered.engine.jobs.rewrite``) with (or,
    when nothing else of the object is read, instead of) its ``ColdRewriteCommitted``:
    no read is ever served from such a range, so it needs no copy. Applying it drops
    each listed reference still reading ``old_key`` exactly (and still in holes): its
    records are released and the object loses the owner, as a retention release does.
    """

    old_key: str
    ts_ms: int
    ranges: tuple[CopyRange, ...]


class AppendKeyed(_Record, frozen=True, tag="append.keyed.v1"):
    """The ``Appended`` just before it, to the header-keyed stream ``uid``, carries ``Stream-Key`` ``key``
    (``header_keys``): journaled right after it in the same batch (an append's data must end its record,
    so the key cannot follow it there). ``tombstone``: an empty append deleting ``key``."""

    uid: int
    start: int
    end: int
    key: str
    tombstone: bool
    ts_ms: int


class KeyIndexCommitted(_Record, frozen=True, tag="stream.key-index.v1"):
    """The compactor wrote header-keyed stream ``uid``'s key index to the cold object ``key`` (uploaded
    after its ``ColdCopyStarted`` intent): it covers every keyed append below ``covers_to``. Journaled
    right after the pass's ``StreamCompacted`` (holes first: a crash between the two leaves holes the
    next pass finds again, never an index that hides an unremoved superseded append)."""

    uid: int
    key: str
    size: int
    crc32c: int
    footer_length: int
    covers_to: int
    keys: int
    folded: int  # how many of the stream's pending keyed appends (from the first) the index now covers
    ts_ms: int


StreamRecord = (
    BucketCreated
    | StreamCreated
    | Appended
    | StreamDeleted
    | StreamTouched
    | StreamExpired
    | ProducersExpired
    | ColdCopyStarted
    | ColdCopyCommitted
    | ColdCopyAborted
    | HotTrimmed
    | BucketErased
    | RetentionPolicySet
    | RetentionAdvanced
    | ColdDeleteStarted
    | ColdDeleteFinished
    | SnapshotPublished
    | SnapshotRetentionSet
    | ColdRewriteCommitted
    | PayloadAppended
    | StreamCompacted
    | StreamKeyed
    | ColdHolesReleased
    | AppendKeyed
    | KeyIndexCommitted
)
