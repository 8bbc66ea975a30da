"""Size quotas held over a bucket's own usage and the other shards' (check_sizes)."""

from __future__ import annotations

import pytest

from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.tenants.quotas import Quotas, check_sizes


def test_check_sizes_holds_the_limit_over_own_and_others_usage() -> None:
    q = Quotas(max_streams=5, max_retained_bytes=100)
    check_sizes(q, (2, 0), (2, 0), 1, 0)  # 2 + 2 + 1 = 5: reaches the limit, allowed
    with pytest.raises(TieredError) as refused:
        check_sizes(q, (2, 0), (3, 0), 1, 0)
    assert refused.value.code is ErrorCode.QUOTA_EXCEEDED
    assert refused.value.context == {"quota": "max_streams", "limit": 5}
    check_sizes(q, (0, 60), (0, 40), 0, 0)
    with pytest.raises(TieredError) as over:
        check_sizes(q, (0, 60), (0, 40), 0, 1)
    assert over.value.context == {"quota": "max_retained_bytes", "limit": 100}
    check_sizes(q, (9, 900), (9, 900), 0, 0)  # nothing added: never refused (deletes must pass)
