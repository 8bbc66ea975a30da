"""Append rules: closing, content types, idempotent producers, ``Stream-Seq``.

``decide_append`` returns the ``Appended`` record to journal, a ``Duplicate``
(a retry of something already applied: answer it without writing), or raises
``TieredError`` having changed nothing. The closed check comes first, as the
protocol asks, so a client always sees ``Stream-Closed``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tiered.core.content import media_type
from tiered.core.errors import ErrorCode, TieredError
from tiered.core.ids import format_offset
from tiered.engine.streams import conditions, integrity, producers
from tiered.engine.streams.model import AppendRequest, Duplicate, Stream
from tiered.engine.streams.producers import ProducerLimits
from tiered.engine.streams.records import Appended, ProducersExpired

if TYPE_CHECKING:
    from tiered.engine.streams.state import Location, StreamState


def decide_append(
    state: StreamState, bucket: str, path: str, req: AppendRequest, now_ms: int
) -> Appended | Duplicate:
    return check_append(state.lookup(bucket, path, now_ms), req, now_ms, state.producer_limits)


def check_append(s: Stream, req: AppendRequest, now_ms: int, limits: ProducerLimits) -> Appended | Duplicate:
    """The append rules for a stream already looked up (so an append looks it up once).

    A producer whose state expired or was evicted (``producers``) is a new producer.
    """
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
        p = producers.live_state(s.producers, req.producer, now_ms, limits)
        if p is None:
            if req.seq != 0:
                raise TieredError(
                    ErrorCode.BAD_REQUEST,
                    "this stream has no state for this producer (a new one, or its state expired or was "
                    "evicted): a new producer starts at Producer-Seq 0",
                )
        elif req.epoch < p.epoch:
            raise TieredError(ErrorCode.STALE_PRODUCER_EPOCH, "stale producer epoch", epoch=p.epoch)
        elif req.epoch > p.epoch:
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
    # After a producer's duplicate: its own append moved the tail (``conditions``).
    conditions.check_expected_offset(s.tail, req.expected_offset)
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
        integrity.note_record(s, record.offset, record.data)
    # Every append drops its stream's expired producer states (and, for a new producer at the cap,
    # the longest idle one): the same plan the quota check charged (``producer_change``).
    change = producers.apply(
        s.producers, record.producer, record.epoch, record.seq, record.ts_ms, state.producer_limits
    )
    s.producer_bytes += change.bytes_delta
    if record.stream_seq is not None:
        s.stream_seq = record.stream_seq
    if record.close:
        s.closed = True
        if record.producer is not None:
            s.closed_by = (record.producer, record.epoch, record.seq)
    s.last_access_ms = max(s.last_access_ms, record.ts_ms)


def producer_change(state: StreamState, s: Stream, record: Appended) -> producers.ProducerChange:
    """What applying ``record`` will do to ``s``'s producer states (charged before it is committed)."""
    return producers.plan(s.producers, record.producer, record.ts_ms, state.producer_limits)


def decide_producers_expired(state: StreamState, now_ms: int, limit: int) -> ProducersExpired | None:
    """GC: streams (at most ``limit``) holding producer states idle past the TTL; None when there are none."""
    limits = state.producer_limits
    uids: list[int] = []
    for s in state.streams.values():
        first = next(iter(s.producers.values()), None)  # the longest idle
        if first is not None and producers.expired(first, now_ms, limits):
            uids.append(s.uid)
            if len(uids) >= limit:
                break
    return ProducersExpired(ts_ms=now_ms, uids=tuple(uids)) if uids else None


def apply_producers_expired(state: StreamState, record: ProducersExpired) -> None:
    for uid in record.uids:
        s = state.streams.get(uid)
        if s is not None:
            change = producers.apply(s.producers, None, 0, 0, record.ts_ms, state.producer_limits)
            s.producer_bytes += change.bytes_delta
