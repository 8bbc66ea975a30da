"""Every journal record of every feature, in one tagged union, and its msgpack codec.

Each feature owns its records (``tiered.engine.streams.records``,
``tiered.engine.subscriptions.records``, ``tiered.engine.groups.records``, ``tiered.engine.auth.records``,
``tiered.engine.tenants.records``); this module only
puts them together so the journal can decode any of them by its tag.
"""

from __future__ import annotations

from typing import Any

import msgspec

from tiered.engine.auth.records import AuthRecord
from tiered.engine.groups.records import GroupRecord
from tiered.engine.streams.records import StreamRecord
from tiered.engine.subscriptions.records import SubscriptionRecord
from tiered.engine.tenants.records import TenantRecord

Record = StreamRecord | GroupRecord | SubscriptionRecord | AuthRecord | TenantRecord

_encoder = msgspec.msgpack.Encoder()
_decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(Record)


def encode_record(record: Record) -> bytes:
    return _encoder.encode(record)


def decode_record(body: bytes) -> Record:
    record: Record = _decoder.decode(body)
    return record
