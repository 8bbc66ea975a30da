"""What the stream state machine is made of: streams, their hot and cold pieces, requests, slices.

Plain data, no rules (the rules live in ``lifecycle``, ``appends``, ``cold_refs``,
``release`` and ``reads``; ``state.StreamState`` holds it all together). No
I/O, no clock, no HTTP: data locations are opaque ``(segment, position)``.

The state's own types are msgspec-encodable (array-like Structs and a
NamedTuple; ``HotChunks`` through ``encode_hook`` and ``decode_hook``), so
they are their snapshot form too (``tiered.engine.snapshot``): a field added
to one of them is in snapshots with no other edit. A field added later goes
last, with a default (older snapshots decode without it); fields that are
derived or soft come after the durable ones and are rebuilt on restore.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Protocol

import msgspec

from tiered.cold.objects.payload import PayloadDigest
from tiered.cold.parquet.chunk_index import ChunkIndex
from tiered.core.content import is_json
from tiered.engine.streams.integrity import StreamIntegrity

#: ``ProducerState.last_ms`` of a producer read from a snapshot written before producer expiry
#: (its state was an (epoch, seq) pair): a restore makes it the stream's last access.
NOT_RECORDED_MS = -1


class ProducerState(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One idempotent producer's state on a stream (replaced, never changed in place)."""

    epoch: int
    last_seq: int
    last_ms: int = NOT_RECORDED_MS  # when its last append was accepted (expiry: ``producers``)


class HotChunks:
    """Where a stream's hot bytes live: parallel arrays, one entry per append."""

    __slots__ = ("starts", "lens", "segs", "poss", "times")

    def __init__(self) -> None:
        self.starts = array("q")
        self.lens = array("q")
        self.segs = array("q")
        self.poss = array("q")
        self.times = array("q")

    def arrays(self) -> tuple[array[int], array[int], array[int], array[int], array[int]]:
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

    def packed(self) -> bytes:
        """The chunks' msgspec-encodable form: the five arrays' bytes, one after the other."""
        return b"".join(arr.tobytes() for arr in self.arrays())

    @classmethod
    def unpacked(cls, parts: bytes | Sequence[bytes]) -> HotChunks:
        """Chunks from ``packed()``, or from the five arrays' bytes apart (snapshots before version 5)."""
        chunks = cls.__new__(cls)
        if isinstance(parts, bytes):
            packed = array("q", parts)
            n, rest = divmod(len(packed), 5)
            if rest:
                raise ValueError("hot chunks: the packed arrays are not of one length")
            chunks.starts, chunks.lens, chunks.segs, chunks.poss, chunks.times = (
                packed[:n],
                packed[n : 2 * n],
                packed[2 * n : 3 * n],
                packed[3 * n : 4 * n],
                packed[4 * n :],
            )
        else:
            chunks.starts, chunks.lens, chunks.segs, chunks.poss, chunks.times = (
                array("q", raw) for raw in parts
            )
        return chunks


def encode_hook(obj: Any) -> Any:
    """msgspec's ``enc_hook`` for the state's types: ``HotChunks`` as their packed arrays."""
    if isinstance(obj, HotChunks):
        return obj.packed()
    if isinstance(obj, StreamIntegrity):
        return obj.packed()
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def decode_hook(type_: type, obj: Any) -> Any:
    """msgspec's ``dec_hook`` for the state's types: ``HotChunks`` from their packed arrays."""
    if type_ is HotChunks:
        if not isinstance(obj, bytes) and not (isinstance(obj, list) and len(obj) == 5):
            raise msgspec.ValidationError("expected hot chunks")
        try:
            return HotChunks.unpacked(obj)
        except (TypeError, ValueError) as exc:
            raise msgspec.ValidationError(str(exc)) from None
    if type_ is StreamIntegrity:
        if not isinstance(obj, list):
            raise msgspec.ValidationError("expected integrity digests")
        try:
            return StreamIntegrity.unpacked(obj)
        except (TypeError, ValueError) as exc:
            raise msgspec.ValidationError(str(exc)) from None
    raise NotImplementedError(f"cannot decode {type_.__name__}")


class ColdRef(msgspec.Struct, frozen=True, array_like=True):
    """A stream range served by a cold object."""

    start: int
    end: int
    key: str


class ColdObject(msgspec.Struct, array_like=True):
    key: str
    size: int
    crc32c: int
    created_ms: int
    index: ChunkIndex
    released_ms: int | None = None  # when refs last reached zero (the grace delay starts)
    deleting: bool = False  # a journaled delete is under way
    # Derived (rebuilt on restore from the streams' cold references): live stream ranges that read from it.
    refs: int = 0
    # A large body stored by reference (``payloads``): the object is its raw bytes, checked by this digest
    # (``index`` is empty); ``payload_base`` is the stream offset of its first byte.
    payload: PayloadDigest | None = None
    payload_base: int = 0
    # The bucket whose bytes a payload or stream snapshot object holds (a Parquet object's buckets are in
    # its index), so the erasure report names it; None for objects from before it was kept.
    owner_bucket: str | None = None


class PublishedSnapshot(msgspec.Struct, frozen=True, array_like=True):
    """A stream's newest snapshot: its state at ``offset``, a cold object of its own (``snapshots``).

    ``digest`` (SHA-256 of the body, hex) is what makes a publish idempotent: the
    same body at the same offset again is the same snapshot.
    """

    offset: int
    key: str
    size: int
    crc32c: int
    digest: str
    content_type: str
    created_ms: int


class KeyedAppend(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One append to a header-keyed stream (``header_keys``): its range, its ``Stream-Key``, whether it
    is a tombstone (``Stream-Key-Tombstone: true``, an empty range), and when it was appended."""

    start: int
    end: int
    key: str
    tombstone: bool
    ts_ms: int


class KeyIndexRef(msgspec.Struct, frozen=True, array_like=True):
    """A header-keyed stream's key index (``key_index_file``): the cold object ``key`` holding, sorted by
    key, the newest append of every key the compactor has seen below ``covers_to``."""

    key: str
    size: int
    crc32c: int
    footer_length: int
    covers_to: int  # appends starting below this are in the index (or superseded); the rest are pending
    keys: int  # how many entries (tombstones included)
    created_ms: int


class PathHistory(NamedTuple):
    """What the streams a path held before tell the next one (kept after they are gone).

    ``incarnations``: how many streams the path held, so the next one's
    incarnation number; ``fence``: the highest offset any of them issued (its
    final tail). A new stream there serves no offset at or below ``fence``.
    """

    incarnations: int
    fence: int


class Stream(msgspec.Struct, array_like=True):
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
    producers: dict[str, ProducerState] = msgspec.field(default_factory=dict)  # least recently used first
    stream_seq: str | None = None
    chunks: HotChunks = msgspec.field(default_factory=HotChunks)
    cold_refs: list[ColdRef] = msgspec.field(default_factory=list)
    cold_end: int = -1  # own data below this is in cold objects (set to fork_offset at creation)
    forks: int = 0  # live forks that read through this stream
    retained_from: int = 0  # reads below this get 410 Gone
    retention_ms: int | None = None
    retention_bytes: int | None = None
    keep_start: int = 0  # data below this is released (not needed by the stream or its forks)
    keep_end: int | None = None  # data from here on is released (soft-deleted sources only)
    soft_deleted: bool = False
    last_access_ms: int = 0
    incarnation: int = 0  # how many streams its path held before it (``PathHistory``)
    # Durable fields above (new ones go here, with a default); derived and soft ones below,
    # rebuilt on restore (``tiered.engine.snapshot``).
    producer_bytes: int = 0  # derived: what ``producers`` counts towards the bucket's retained bytes
    touch_journaled_ms: int = 0
    # Durable, added after the derived fields above (so older snapshots decode without it): the newest
    # snapshot a writer published (``tiered.engine.streams.snapshots``).
    snapshot: PublishedSnapshot | None = None
    retain_snapshot: bool = False  # ``retain: snapshot`` on this stream: retention follows its snapshot
    # Durable, added after the fields above (so older snapshots decode): the stream's integrity
    # digests (``integrity``); None for a stream from data written before digests were kept.
    integrity: StreamIntegrity | None = None
    # Durable, added after the fields above (so older snapshots decode): keyed compaction (``keyed``).
    compaction_key: str | None = None  # the JSON pointer naming each message's key; None: not keyed
    holes: tuple[tuple[int, int], ...] = ()  # removed message ranges, sorted, merged (reads skip them)
    # Durable, added after the fields above: per-append keys of a stream keyed by header
    # (``Stream-Compaction-Key: header``, ``header_keys``): the keyed appends the compactor's key index
    # does not cover yet, in offset order, and that index (a cold object of its own).
    pending_keys: list[KeyedAppend] = msgspec.field(default_factory=list)
    key_index: KeyIndexRef | None = None

    # Not journal state: when the journal last heard of a TTL touch (a throttle).
    SOFT_STATE: ClassVar[tuple[str, ...]] = ("touch_journaled_ms",)

    @property
    def json(self) -> bool:
        return is_json(self.content_type)

    def expired(self, now_ms: int) -> bool:
        if self.expires_at_ms is not None and now_ms >= self.expires_at_ms:
            return True
        return self.ttl_s is not None and now_ms >= self.last_access_ms + self.ttl_s * 1000


@dataclass(frozen=True, slots=True)
class ForkCopy:
    """A fork of a stream this engine does not hold (cluster mode: another shard's), as a copy.

    ``base`` is the source's stored bytes ``[base_from, offset)``, fetched when the
    fork is created; the fork stores them as its own data at the same offsets.
    The expiry and content type are the ones the source's engine resolved (a
    fork inherits its source's expiry when it names none). ``None`` in
    ``ForkRequest.copy``: not fetched (a live stream already holds the path).
    """

    base: bytes
    base_from: int
    content_type: str
    ttl_s: int | None
    expires_at: str | None
    expires_at_ms: int | None


@dataclass(frozen=True, slots=True)
class ForkRequest:
    source_uid: int | None  # None: the source is elsewhere, ``copy`` holds what the fork inherits
    offset: int  # resolved absolute fork point
    spec: str  # canonical description of the fork headers
    copy: ForkCopy | None = None


@dataclass(frozen=True, slots=True)
class CreateRequest:
    content_type: str | None
    ttl_s: int | None
    expires_at: str | None
    expires_at_ms: int | None
    closed: bool
    data: bytes
    fork: ForkRequest | None = None
    compaction_key: str | None = None  # issue 21: ``Stream-Compaction-Key`` (``keyed``)


class AppendRequest(msgspec.Struct, frozen=True):
    """One append, as the route parsed it (a frozen Struct: built for every append, at a tenth of a frozen
    dataclass's cost; ``msgspec.structs.replace`` changes a field)."""

    content_type: str | None
    data: bytes
    close: bool
    producer: str | None = None
    epoch: int = 0
    seq: int = 0
    stream_seq: str | None = None
    expected_offset: int | None = None  # issue 22: ``Stream-Expected-Offset`` (``conditions``)
    expected_record: int | None = None  # issue 22: ``Stream-Record-Match`` (``conditions``, ``ordinals``)
    key: str | None = None  # issue 21: ``Stream-Key`` (``header_keys``)
    tombstone: bool = False  # issue 21: ``Stream-Key-Tombstone: true`` (an empty body deleting ``key``)


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
    An extension that lists stream record types in ``observed_types`` has
    ``observe(record, state)`` called right after ``StreamState`` applied one
    (tenants count usage there, so replay counts exactly what was journaled).
    """

    name: str
    record_types: tuple[type, ...]

    def apply(self, record: Any) -> None: ...

    def snapshot(self) -> bytes: ...

    def restore(self, data: bytes) -> None: ...


class StreamObserver(Protocol):
    """An extension that lists ``observed_types``: sees those stream records once applied."""

    def observe(self, record: Any, state: Any) -> None: ...
