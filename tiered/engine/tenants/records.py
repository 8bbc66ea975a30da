"""Journal records of tenants: a bucket's quota overrides, and the usage recorded since the last record.

Appended bytes and records are not journaled here: they are counted when the
``Appended`` and ``StreamCreated`` records themselves are applied
(``TenantState.observe``), so they are exactly what was acknowledged.
Egress and request counts happen in memory and are journaled by a
``UsageRecorded`` record every ``--usage-interval-s``.
"""

from __future__ import annotations

import msgspec


class _TenantRecord(msgspec.Struct, array_like=True, frozen=True, tag_field="t"):
    pass


class QuotaSet(_TenantRecord, frozen=True, tag="tenant.quota.v1"):
    """The bucket's quota overrides, replacing the previous ones: (name, limit or None for unlimited)."""

    bucket: str
    limits: tuple[tuple[str, int | None], ...]
    ts_ms: int


class UsageDelta(msgspec.Struct, array_like=True, frozen=True):
    bucket: str
    egress_hot: int
    egress_cold: int
    append_requests: int
    read_requests: int
    live_requests: int
    admin_requests: int


class UsageRecorded(_TenantRecord, frozen=True, tag="tenant.usage.v1"):
    ts_ms: int
    deltas: tuple[UsageDelta, ...]


TenantRecord = QuotaSet | UsageRecorded
TENANT_RECORD_TYPES: tuple[type, ...] = (QuotaSet, UsageRecorded)
