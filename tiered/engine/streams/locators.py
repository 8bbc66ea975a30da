"""Cold locators: what another node needs to answer a catch-up read of a stream from the object store.

In cluster mode a node that does not own a stream's shard may answer a
catch-up read below the stream's cold frontier itself (``tiered/cluster/
catchup.py``). It asks the owner once for a *locator*: the stream's read
metadata (uid, content type, the visible tail, the read chunk size) and the
cold objects that hold ``[start, cold_end)``, each with its index restricted to
the stream (row group spans and their CRC32C digests, so the reader checks
every byte it fetches), valid for ``valid_ms``, and the stream's record
ordinals over that range (``record_of``: the reader's ``Stream-Record`` is the
owner's).

Why a locator is safe to use while it is valid: cold objects are immutable,
and one the stream stops referencing (retention, deletion, compaction) is
deleted only ``gc_grace_s`` after its release; the validity is strictly less
than the grace. The stream's metadata the answer depends on is fixed for
reads that end below the tail as of issue: the tail only grows, so such a read
is never "up to date" and never "closed" (see ``servable_end``).

Pure: built from ``StreamState`` and the stream, no I/O.
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_right
from collections.abc import Iterable
from typing import TYPE_CHECKING

import msgspec

from tiered.cold.objects.keys import DATA_PREFIX
from tiered.cold.parquet.chunk_index import ChunkIndex
from tiered.engine.streams import ordinals
from tiered.engine.streams.model import ColdSlice, Stream

if TYPE_CHECKING:
    from tiered.engine.streams.state import StreamState

__all__ = [
    "LOCATOR_HEADER",
    "LOCATOR_MEDIA_TYPE",
    "LOCATOR_SPAN_BYTES",
    "MAX_PIECES",
    "MAX_RECORDS",
    "ColdPiece",
    "Locator",
    "build_locator",
    "decode_locator",
    "encode_locator",
    "record_of",
    "servable_end",
]

#: On a read sent by a peer node: "answer with a locator if the read is all cold" (and on that answer).
LOCATOR_HEADER = "Tiered-Locator"
LOCATOR_MEDIA_TYPE = "application/vnd.tiered.locator+msgpack"
#: How far past the read's offset one locator reaches (one owner round trip per this many bytes read).
LOCATOR_SPAN_BYTES = 64 * 1024 * 1024
#: Cold pieces in one locator at most (a stream flushed in many small objects gets shorter locators).
MAX_PIECES = 256


class ColdPiece(msgspec.Struct, frozen=True, array_like=True):
    """Bytes ``[start, end)`` of stream ``bucket/path`` (a fork's source, maybe) in cold object ``key``."""

    key: str  # relative to the shard's store prefix
    bucket: str
    path: str
    start: int
    end: int
    index: ChunkIndex  # restricted to ``bucket/path``


class Locator(msgspec.Struct, frozen=True):
    uid: int
    content_type: str
    json: bool
    tail: int  # the visible tail when issued
    chunk_bytes: int  # the owner's read_chunk_bytes: the answer's end is min(tail, offset + chunk_bytes)
    start: int
    cold_end: int  # ``pieces`` cover ``[start, cold_end)`` contiguously
    valid_ms: int
    pieces: tuple[ColdPiece, ...]
    retained_from: int = 0  # where a read at offset -1 starts (as of issue)
    # ``Stream-Record`` (``ordinals``): the ordinal of the message holding ``start`` (None: the stream keeps
    # no ordinals), and where that ordinal changes up to ``cold_end`` (little-endian int64 offsets and
    # ordinals, packed: ``record_of``). A peer of an older version sends none: its reads carry no header.
    record_first: int | None = None
    record_offs: bytes = b""
    record_ords: bytes = b""


#: Ordinal changes one locator carries at most (16 bytes each); a locator of more messages is cut short.
MAX_RECORDS = 65536

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Locator)


def encode_locator(locator: Locator) -> bytes:
    return _encoder.encode(locator)


def decode_locator(data: bytes) -> Locator:
    """The locator in ``data``; ``ValueError`` if it is not one (a peer of another version, damage)."""
    try:
        locator = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not a locator: {exc}") from None
    if len(locator.record_offs) != len(locator.record_ords) or len(locator.record_offs) % 8:
        raise ValueError("a locator's record offsets and ordinals must be int64 arrays of one length")
    if not _contiguous(locator):
        raise ValueError("a locator's pieces must be cold objects covering [start, cold_end) contiguously")
    return locator


def _contiguous(locator: Locator) -> bool:
    at = locator.start
    for piece in locator.pieces:
        if piece.start != at or piece.end <= piece.start or not piece.key.startswith(DATA_PREFIX):
            return False  # gaps, empty pieces, or a key that is no cold object's
        at = piece.end
    return at == locator.cold_end and locator.start < locator.cold_end <= locator.tail


def servable_end(locator: Locator, offset: int) -> int | None:
    """End of the owner's answer to a read at ``offset`` if it lies wholly in the locator, else None.

    The owner answers ``[offset, min(tail, offset + chunk_bytes))`` (a JSON
    stream's answer is cut back to a message boundary, which only shortens it;
    ``tiered/cluster/gateway/catchup.py`` checks the rare longer case). Strictly below
    the tail as of issue, the answer carries neither ``Stream-Up-To-Date`` nor
    ``Stream-Closed``, whatever was appended since.
    """
    end = offset + locator.chunk_bytes
    if offset < locator.start or end > locator.cold_end or end >= locator.tail:
        return None
    return end


def _packed(values: Iterable[int]) -> bytes:
    packed = array("q", values)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def _unpacked(data: bytes) -> array[int]:
    values = array("q", data)
    if sys.byteorder != "little":
        values.byteswap()
    return values


def record_of(locator: Locator, offset: int) -> int | None:
    """``Stream-Record`` of a read at ``offset`` (in ``[start, cold_end)``), as the owner answers it."""
    if locator.record_first is None:
        return None
    offs = _unpacked(locator.record_offs)
    i = bisect_right(offs, offset) - 1
    return locator.record_first if i < 0 else _unpacked(locator.record_ords)[i]


def build_locator(
    state: StreamState,
    s: Stream,
    *,
    tail: int,
    offset: int,
    chunk_bytes: int,
    span_bytes: int,
    valid_ms: int,
    now_ms: int,
    index_of: ordinals.IndexOf | None = None,
) -> Locator | None:
    """A locator for reads of ``s`` from ``offset`` on, or None when the read at ``offset`` is not all cold.

    Also None for a stream with a TTL (a read renews it on its owner: such reads
    stay with the owner) and when ``valid_ms`` is not positive. A stream that
    expires at a set time gets a validity that ends before it does.
    ``index_of`` (the service's record indexes): the locator carries the
    stream's ordinals over its range, so the reader answers ``Stream-Record``.
    """
    if valid_ms <= 0 or s.ttl_s is not None or chunk_bytes <= 0:
        return None
    if s.expires_at_ms is not None:
        valid_ms = min(valid_ms, s.expires_at_ms - now_ms)
        if valid_ms <= 0:
            return None
    span = max(span_bytes, 2 * chunk_bytes + 2)
    if offset + chunk_bytes >= tail:
        return None  # the answer would be up to date
    # Half the span before the offset too: readers that jump around (or several readers of one
    # stream) find one locator for the whole neighbourhood. Never below the retained start.
    lo = max(s.retained_from, offset - span // 2, 0)
    found = _with_records(_locate(state, s, lo, min(tail, lo + span), chunk_bytes, tail, valid_ms), index_of)
    if found is not None and servable_end(found, offset) is not None:
        return found
    found = _locate(state, s, offset, min(tail, offset + span), chunk_bytes, tail, valid_ms)
    found = _with_records(found, index_of)
    return found if found is not None and servable_end(found, offset) is not None else None


def _with_records(locator: Locator | None, index_of: ordinals.IndexOf | None) -> Locator | None:
    """``locator`` with the stream's ordinals over its range (cut short at ``MAX_RECORDS`` changes)."""
    if locator is None or index_of is None or index_of(locator.uid) is None:
        return locator
    start, end = locator.start, locator.cold_end
    changes = ordinals.changes(index_of, locator.uid, start, end, locator.tail)
    if len(changes) > MAX_RECORDS:
        end = changes[MAX_RECORDS][0]  # > start: the first change at start, if any, is kept
        changes = changes[:MAX_RECORDS]
        pieces = tuple(
            p if p.end <= end else msgspec.structs.replace(p, end=end)
            for p in locator.pieces
            if p.start < end
        )
        locator = msgspec.structs.replace(locator, cold_end=end, pieces=pieces)
    first = ordinals.ordinal_containing(index_of, locator.uid, start, locator.tail)
    return msgspec.structs.replace(
        locator,
        record_first=first,
        record_offs=_packed(o for o, _ in changes),
        record_ords=_packed(n for _, n in changes),
    )


def _locate(
    state: StreamState, s: Stream, start: int, limit: int, chunk_bytes: int, tail: int, valid_ms: int
) -> Locator | None:
    """The locator of the cold run from ``start`` on (up to ``limit`` and ``MAX_PIECES``); None if none."""
    pieces: list[ColdPiece] = []
    at = start
    for sl in state.plan_read(s, start, limit):
        if not isinstance(sl, ColdSlice) or sl.start != at or len(pieces) >= MAX_PIECES:
            break  # the hot tier starts here (or the locator is long enough)
        obj = state.cold_objects.get(sl.key)
        if obj is None or obj.deleting or obj.payload is not None:
            break  # a large body stored by reference is read through its owner (its digest checks it)
        try:
            index = obj.index.for_stream(sl.bucket, sl.path)
        except KeyError:
            break
        pieces.append(ColdPiece(sl.key, sl.bucket, sl.path, sl.start, sl.end, index))
        at = sl.end
    if at == start:
        return None
    return Locator(
        s.uid, s.content_type, s.json, tail, chunk_bytes, start, at, valid_ms, tuple(pieces), s.retained_from
    )
