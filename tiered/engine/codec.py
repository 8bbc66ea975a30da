"""Every journal record of every feature, in one tagged union, and its msgpack codec.

Each feature owns its records (``tiered.engine.streams.records``,
``tiered.engine.subscriptions.records``, ``tiered.engine.groups.records``, ``tiered.engine.auth.records``,
``tiered.engine.tenants.records``); this module only puts them together, above
the journal: ``RECORDS`` is the ``RecordCodec`` the journal is given, so it can
frame and replay any of them without knowing one.
"""

from __future__ import annotations

from typing import Any

import msgspec

from tiered.engine.auth.records import AuthRecord
from tiered.engine.groups.records import GroupRecord
from tiered.engine.journal.journal import Location, payload_location
from tiered.engine.streams.records import Appended, StreamCreated, StreamRecord
from tiered.engine.subscriptions.records import SubscriptionRecord
from tiered.engine.tenants.records import TenantRecord
from tiered.hot.log import LogPosition

Record = StreamRecord | GroupRecord | SubscriptionRecord | AuthRecord | TenantRecord

_encoder = msgspec.msgpack.Encoder()
_decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(Record)


def encode_record(record: Record) -> bytes:
    return _encoder.encode(record)


def decode_record(body: bytes) -> Record:
    record: Record = _decoder.decode(body)
    return record


def payload_of(record: Record) -> bytes | None:
    """The data an append or a create carries: the end of its body, read in place by readers."""
    if isinstance(record, (Appended, StreamCreated)):
        return record.data
    return None


def data_location(record: Record, body_pos: LogPosition, body_len: int) -> Location | None:
    """Where a record's payload bytes sit in the log (they end the body)."""
    return payload_location(payload_of(record), body_pos, body_len)


class EngineRecords:
    """The ``RecordCodec`` of the engine's journal."""

    def encode(self, record: Any) -> bytes:
        return _encoder.encode(record)

    def decode(self, body: bytes) -> Any:
        return _decoder.decode(body)

    def payload(self, record: Any) -> bytes | None:
        return payload_of(record)


RECORDS = EngineRecords()
