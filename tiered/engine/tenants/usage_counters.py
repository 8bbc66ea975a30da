"""Usage counters per bucket: what the state keeps, and what the shell counts before journaling it.

``BucketUsage`` is journal state (``TenantState``), monotonic, never removed
(the bill outlives an erased bucket):

* ``appended_bytes``, ``appended_records``: counted when an ``Appended`` (or a
  ``StreamCreated`` with a body) record is applied, so exactly what was
  acknowledged: an idempotent producer's retry writes no record and counts
  nothing; replay after a snapshot applies only what the snapshot lacks;
* egress by tier and requests by class: counted in memory by the shell
  (``UsageCounter``) and added to the state by ``UsageRecorded`` records every
  ``--usage-interval-s``: a crash loses at most the counts of that interval.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tiered.engine.tenants.records import UsageDelta

REQUEST_CLASSES = ("append", "read", "live", "admin")
TIERS = ("hot", "cold")


@dataclass(slots=True)
class BucketUsage:
    appended_bytes: int = 0
    appended_records: int = 0
    egress_hot: int = 0
    egress_cold: int = 0
    append_requests: int = 0
    read_requests: int = 0
    live_requests: int = 0
    admin_requests: int = 0

    def add(self, d: UsageDelta) -> None:
        self.egress_hot += d.egress_hot
        self.egress_cold += d.egress_cold
        self.append_requests += d.append_requests
        self.read_requests += d.read_requests
        self.live_requests += d.live_requests
        self.admin_requests += d.admin_requests

    def as_json(self) -> dict[str, Any]:
        return {
            "appended_bytes": self.appended_bytes,
            "appended_records": self.appended_records,
            "egress_bytes": {"hot": self.egress_hot, "cold": self.egress_cold},
            "requests": {
                "append": self.append_requests,
                "read": self.read_requests,
                "live": self.live_requests,
                "admin": self.admin_requests,
            },
        }


_CLASS_INDEX = {name: 2 + i for i, name in enumerate(REQUEST_CLASSES)}


class UsageCounter:
    """Egress and requests counted since the last ``UsageRecorded`` (not journal state)."""

    def __init__(self) -> None:
        # bucket -> [egress_hot, egress_cold, append, read, live, admin]
        self._pending: dict[str, list[int]] = {}

    def _row(self, bucket: str) -> list[int]:
        row = self._pending.get(bucket)
        if row is None:
            row = self._pending[bucket] = [0, 0, 0, 0, 0, 0]
        return row

    def egress(self, bucket: str, hot: int, cold: int) -> None:
        row = self._row(bucket)
        row[0] += hot
        row[1] += cold

    def request(self, bucket: str, request_class: str) -> None:
        self._row(bucket)[_CLASS_INDEX[request_class]] += 1

    def take(self) -> tuple[UsageDelta, ...]:
        """Everything counted so far, as deltas to journal; the counter starts again from zero."""
        pending, self._pending = self._pending, {}
        return tuple(UsageDelta(b, *row) for b, row in sorted(pending.items()) if any(row))

    def put_back(self, deltas: tuple[UsageDelta, ...]) -> None:
        """Deltas that could not be journaled: count them again with the next record."""
        for d in deltas:
            row = self._row(d.bucket)
            for i, v in enumerate(
                (
                    d.egress_hot,
                    d.egress_cold,
                    d.append_requests,
                    d.read_requests,
                    d.live_requests,
                    d.admin_requests,
                )
            ):
                row[i] += v

    def pending(self, bucket: str) -> UsageDelta:
        row = self._pending.get(bucket) or [0, 0, 0, 0, 0, 0]
        return UsageDelta(bucket, *row)
