"""Large bodies stored by reference: the state rules (pure).

A ``PayloadAppended`` record says: the stream's bytes ``[offset, offset +
size)`` are the object ``key`` (uploaded and checksummed before the record
was journaled). Applying it makes ``key`` a cold object (``ColdObject.payload``
holds its digest) that the stream references with a ``ColdRef``, so
retention, deletion, bucket erasure, GC's grace and journaled deletes, and
reconciliation treat it exactly like a flushed Parquet object.

The one new shape this gives the state: a payload may land while the stream
still has hot bytes not yet flushed below it. Its reference then sits past
``cold_end`` (the hot chunks have a gap where it is), and ``settle`` moves
``cold_end`` over it as soon as the cold prefix reaches it (a flush commit,
or retention moving past it). Read planning fills a gap in the hot chunks
from the cold references (``reads``), and flush planning stops at a gap
(``tiered.engine.jobs.flush_plan``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tiered.cold.parquet.chunk_index import ChunkIndex
from tiered.engine.streams import appends, integrity
from tiered.engine.streams.cold_prefix import settle
from tiered.engine.streams.model import ColdObject, ColdRef, Stream
from tiered.engine.streams.records import PayloadAppended
from tiered.engine.streams.release import hot_contribution

if TYPE_CHECKING:
    from tiered.engine.streams.state import Location, StreamState


def empty_index(size: int) -> ChunkIndex:
    """A payload object is not Parquet: no row groups, no streams (readers use its digest)."""
    return ChunkIndex(file_size=size, footer_length=0, row_groups=(), streams=())


def apply_payload_appended(state: StreamState, record: PayloadAppended, location: Location | None) -> None:
    s = state.streams[record.uid]
    digest = record.digest
    state.copies_in_flight.pop(record.key, None)  # the upload's intent (``ColdCopyStarted``) is fulfilled
    obj = state.cold_objects.get(record.key)
    if obj is None:
        obj = ColdObject(
            record.key,
            digest.size,
            digest.crc32c,
            record.ts_ms,
            empty_index(digest.size),
            payload=digest,
            payload_base=record.offset,
            owner_bucket=s.bucket,
        )
        state.cold_objects[record.key] = obj
    if digest.size:
        before = hot_contribution(s)
        s.cold_refs.append(ColdRef(record.offset, record.offset + digest.size, record.key))
        obj.refs += 1
        integrity.note_payload(s, record.offset, digest.size, record.record_hash)
        s.tail = record.offset + digest.size
        settle(s)
        state.hot_bytes += hot_contribution(s) - before
    if obj.refs == 0 and obj.released_ms is None:
        obj.released_ms = record.ts_ms
    # Producers, Stream-Seq, closing and the last access: as any append (``data`` is empty).
    appends.apply_appended(state, record, None)


def payload_refs(s: Stream, state: StreamState) -> list[ColdRef]:
    """The stream's references to payload objects (tools, tests)."""
    return [
        ref
        for ref in s.cold_refs
        if (obj := state.cold_objects.get(ref.key)) is not None and obj.payload is not None
    ]
