"""The write gate refuses against the bucket-wide total: its own footprint plus the others' usage."""

from __future__ import annotations

import pytest

from tiered.core.clock import SystemClock
from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.tenants.gate import TenantGate
from tiered.engine.tenants.quotas import Quotas
from tiered.engine.tenants.state import TenantState


class _Footprint:
    def __init__(self, totals: tuple[int, int]) -> None:
        self.value = totals

    def totals(self, bucket: str) -> tuple[int, int]:
        return self.value


def test_the_gate_refuses_against_the_bucket_wide_total() -> None:
    tenants = TenantState()
    tenants.quotas["b"] = {"max_streams": 3}
    gate = TenantGate(tenants, _Footprint((1, 0)), Quotas(), SystemClock())  # type: ignore[arg-type]
    gate.admit("b", body_bytes=0, stored_bytes=0, new_streams=1, rated=False)  # alone: 2 of 3
    gate.others = lambda bucket: (2, 0) if bucket == "b" else (0, 0)
    with pytest.raises(TieredError) as refused:
        gate.admit("b", body_bytes=0, stored_bytes=0, new_streams=1, rated=False)
    assert refused.value.code is ErrorCode.QUOTA_EXCEEDED and refused.value.context["limit"] == 3
    assert gate.refusals == {("b", "max_streams"): 1}
    gate.admit("other", body_bytes=0, stored_bytes=0, new_streams=1, rated=False)
