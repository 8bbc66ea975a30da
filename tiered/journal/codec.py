"""Every journal record of every feature, in one tagged union, and its msgpack codec.

Each feature owns its records (``tiered.streams.records``,
``tiered.subscriptions.records``, ``tiered.groups.records``, ``tiered.auth.records``,
``tiered.tenants.records``); this module only
puts them together so the journal can decode any of them by its tag.
"""

from __future__ import annotations

from typing import Any

import msgspec

from tiered.auth.records import AuthRecord
from tiered.groups.records import GroupRecord
from tiered.streams.records import StreamRecord
from tiered.subscriptions.records import SubscriptionRecord
from tiered.tenants.records import TenantRecord

Record = StreamRecord | GroupRecord | SubscriptionRecord | AuthRecord | TenantRecord

_encoder = msgspec.msgpack.Encoder()
_decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(Record)


def encode_record(record: Record) -> bytes:
    return _encoder.encode(record)


def decode_record(body: bytes) -> Record:
    record: Record = _decoder.decode(body)
    return record
