"""Append rules: closing, content types, idempotent producers, ``Stream-Seq``.

``decide_append`` returns the ``Appended`` record to journal, a ``Duplicate``
(a retry of something already applied: answer it without writing), or raises
``TieredError`` having changed nothing. The closed check comes first, as the
protocol asks, so a client always sees ``Stream-Closed``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tiered.content import media_type
from tiered.errors import ErrorCode, TieredError
from tiered.ids import format_offset

from .model import AppendRequest, Duplicate, ProducerState, Stream
from .records import Appended

if TYPE_CHECKING:
    from .state import Location, StreamState


def decide_append(
    state: StreamState, bucket: str, path: str, req: AppendRequest, now_ms: int
) -> Appended | Duplicate:
    return check_append(state.lookup(bucket, path, now_ms), req, now_ms)


def check_append(s: Stream, req: AppendRequest, now_ms: int) -> Appended | Duplicate:
    """The append rules for a stream already looked up (so an append looks it up once)."""
    if s.closed:
        ident = (req.producer, req.epoch, req.seq) if req.producer is not None else None
        if ident is not None and ident == s.closed_by:
            return Duplicate(s, req.epoch, req.seq)
        if not req.data and req.close:
            return Duplicate(s, None, None)
        raise TieredError(ErrorCode.STREAM_CLOSED, "stream is closed", next_offset=format_offset(s.tail))
    if (
        req.data
        and req.content_type is not None
        and media_type(req.content_type) != media_type(s.content_type)
    ):
        raise TieredError(
            ErrorCode.CONTENT_TYPE_MISMATCH, f"content type does not match the stream's ({s.content_type})"
        )
    if req.producer is not None:
        p = s.producers.get(req.producer)
        if p is not None and req.epoch < p.epoch:
            raise TieredError(ErrorCode.STALE_PRODUCER_EPOCH, "stale producer epoch", epoch=p.epoch)
        if p is None or req.epoch > p.epoch:
            if req.seq != 0:
                raise TieredError(ErrorCode.BAD_REQUEST, "a new producer epoch must start at sequence 0")
        elif req.seq <= p.last_seq:
            return Duplicate(s, p.epoch, p.last_seq)
        elif req.seq > p.last_seq + 1:
            raise TieredError(
                ErrorCode.PRODUCER_SEQ_GAP,
                "producer sequence gap",
                expected_seq=p.last_seq + 1,
                received_seq=req.seq,
            )
    if req.stream_seq is not None and s.stream_seq is not None and req.stream_seq <= s.stream_seq:
        raise TieredError(ErrorCode.STREAM_SEQ_REGRESSION, "Stream-Seq must increase")
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


def apply_appended(state: StreamState, record: Appended, location: Location | None) -> None:
    s = state.streams[record.uid]
    if record.data:
        if location is None:
            raise ValueError("an append with data needs its location")
        s.chunks.add(record.offset, len(record.data), location[0], location[1], record.ts_ms)
        s.tail = record.offset + len(record.data)
        state.note_hot(s.uid)
        state.hot_bytes += len(record.data)
    if record.producer is not None:
        s.producers[record.producer] = ProducerState(record.epoch, record.seq)
    if record.stream_seq is not None:
        s.stream_seq = record.stream_seq
    if record.close:
        s.closed = True
        if record.producer is not None:
            s.closed_by = (record.producer, record.epoch, record.seq)
    s.last_access_ms = max(s.last_access_ms, record.ts_ms)
