"""Tenant state: each bucket's quota overrides and its usage counters; a ``StateExtension``.

Besides its own records (``QuotaSet``, ``UsageRecorded``) it observes the
stream records that store bytes (``StreamCreated``, ``Appended``) right after
``StreamState`` applied them, which is where appended bytes and records are
counted: once per record, in the journal's order, live and in replay alike.
"""

from __future__ import annotations

from typing import Any

import msgspec

from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.streams.records import Appended, PayloadAppended, StreamCreated
from tiered.engine.streams.state import StreamState
from tiered.engine.tenants.quotas import validate_overrides
from tiered.engine.tenants.records import TENANT_RECORD_TYPES, QuotaSet, UsageRecorded
from tiered.engine.tenants.usage_counters import BucketUsage


class _UsageSnap(msgspec.Struct, array_like=True):
    bucket: str
    counters: tuple[int, int, int, int, int, int, int, int]


class _TenantSnap(msgspec.Struct, array_like=True):
    version: int
    quotas: dict[str, dict[str, int | None]]
    usage: list[_UsageSnap]


class TenantState:
    name = "tenants"
    record_types: tuple[type, ...] = TENANT_RECORD_TYPES
    observed_types: tuple[type, ...] = (StreamCreated, Appended, PayloadAppended)

    def __init__(self) -> None:
        self.quotas: dict[str, dict[str, int | None]] = {}  # bucket -> explicit overrides
        self.usage: dict[str, BucketUsage] = {}

    def usage_of(self, bucket: str) -> BucketUsage:
        u = self.usage.get(bucket)
        if u is None:
            u = self.usage[bucket] = BucketUsage()
        return u

    def peek(self, bucket: str) -> BucketUsage:
        """A bucket's counters without creating an entry (zeros if it has none)."""
        return self.usage.get(bucket) or BucketUsage()

    # ------------------------------------------------------------- decide

    def decide_quotas(
        self, bucket: str, overrides: dict[str, int | None], buckets: dict[str, int], now_ms: int
    ) -> QuotaSet:
        if bucket not in buckets:
            raise TieredError(ErrorCode.BUCKET_NOT_FOUND, f"bucket {bucket!r} does not exist")
        return QuotaSet(bucket=bucket, limits=validate_overrides(overrides), ts_ms=now_ms)

    # ------------------------------------------------------------- apply

    def apply(self, record: Any) -> None:
        if isinstance(record, UsageRecorded):
            for d in record.deltas:
                self.usage_of(d.bucket).add(d)
        elif isinstance(record, QuotaSet):
            if record.limits:
                self.quotas[record.bucket] = dict(record.limits)
            else:
                self.quotas.pop(record.bucket, None)
        else:
            raise TypeError(f"tenant state does not apply {type(record).__name__}")

    def observe(self, record: Any, streams: StreamState) -> None:
        """A stream record was applied: count what it stored."""
        if isinstance(record, Appended):
            if record.length:  # a large body stored by reference counts its bytes too
                u = self.usage_of(streams.streams[record.uid].bucket)
                u.appended_bytes += record.length
                u.appended_records += 1
        elif isinstance(record, StreamCreated) and record.data:
            u = self.usage_of(record.bucket)
            u.appended_bytes += len(record.data)
            u.appended_records += 1

    # ------------------------------------------------------------- snapshot

    def snapshot(self) -> bytes:
        usage = [
            _UsageSnap(
                b,
                (
                    u.appended_bytes,
                    u.appended_records,
                    u.egress_hot,
                    u.egress_cold,
                    u.append_requests,
                    u.read_requests,
                    u.live_requests,
                    u.admin_requests,
                ),
            )
            for b, u in sorted(self.usage.items())
        ]
        quotas = {b: dict(sorted(q.items())) for b, q in sorted(self.quotas.items())}
        return msgspec.msgpack.encode(_TenantSnap(1, quotas, usage))

    def restore(self, data: bytes) -> None:
        snap = msgspec.msgpack.decode(data, type=_TenantSnap)
        self.quotas = {b: dict(q) for b, q in snap.quotas.items()}
        self.usage = {u.bucket: BucketUsage(*u.counters) for u in snap.usage}
