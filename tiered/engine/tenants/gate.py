"""The quota gate on the write and live-read paths (the shell around ``quotas`` and ``ratelimit``).

``admit`` runs after a write was decided and before it is committed, with no
``await`` in between (``StreamService``), so the check and the write are one
step: nothing is half-written, and the write that reaches a limit is the last
one to pass. Rate buckets and live-reader counts are in memory (a restart
starts every bucket full); quotas come from ``TenantState`` and the config.
"""

from __future__ import annotations

from collections.abc import Callable

from tiered.core.clock import Clock
from tiered.core.errors import TieredError
from tiered.engine.tenants import quotas as q
from tiered.engine.tenants.footprint import FootprintCache
from tiered.engine.tenants.quotas import Quotas
from tiered.engine.tenants.ratelimit import TokenBucket, retry_after_s
from tiered.engine.tenants.state import TenantState

LIVE_RETRY_AFTER_S = 1


class TenantGate:
    def __init__(
        self,
        tenants: TenantState,
        footprint: FootprintCache,
        defaults: Quotas,
        clock: Clock,
        *,
        others: Callable[[str], tuple[int, int]] | None = None,
    ) -> None:
        self.tenants = tenants
        self.footprint = footprint
        self.defaults = defaults
        self.clock = clock
        self._effective: dict[
            str, tuple[object, Quotas, bool]
        ] = {}  # bucket -> (overrides, quotas, unlimited)
        self._rates: dict[tuple[str, str], TokenBucket] = {}
        self.live: dict[str, int] = {}
        self.refusals: dict[tuple[str, str], int] = {}  # (bucket, quota) -> count
        #: Cluster mode: (streams, retained bytes) of a bucket in the other shards; None: none elsewhere.
        self.others = others

    def _lookup(self, bucket: str) -> tuple[object, Quotas, bool]:
        overrides = self.tenants.quotas.get(bucket)
        cached = self._effective.get(bucket)
        if cached is not None and cached[0] is overrides:
            return cached
        effective = q.effective(self.defaults, overrides or {})
        entry = self._effective[bucket] = (overrides, effective, effective.unlimited)
        return entry

    def quotas(self, bucket: str) -> Quotas:
        return self._lookup(bucket)[1]

    def _rate(self, bucket: str, quota: str, limit: int, now_ms: int) -> TokenBucket:
        key = (bucket, quota)
        tb = self._rates.get(key)
        if tb is None or tb.rate != limit:
            tb = self._rates[key] = TokenBucket(limit, now_ms)
        return tb

    def _refused(self, bucket: str, quota: str) -> None:
        key = (bucket, quota)
        self.refusals[key] = self.refusals.get(key, 0) + 1

    def admit(
        self,
        bucket: str,
        *,
        body_bytes: int,
        stored_bytes: int,
        new_streams: int,
        rated: bool,
        state_bytes: int = 0,
    ) -> None:
        """Refuse (``TieredError``) a write over any quota; otherwise take its rate tokens.

        ``state_bytes``: how much the write changes the producer state its bucket keeps
        (``tiered/engine/streams/producers.py``): retained like stored bytes, but not appended bytes
        (no rate counts it).
        """
        _, quotas, unlimited = self._lookup(bucket)
        if unlimited:
            return
        sized = quotas.max_streams is not None or quotas.max_retained_bytes is not None
        # Not a refusal by a quota when the other shards' usage is unknown (cluster mode): raised as it is.
        others = self.others(bucket) if sized and self.others is not None else (0, 0)
        try:
            q.check_body(quotas, body_bytes)
            if sized:
                q.check_sizes(
                    quotas, self.footprint.totals(bucket), others, new_streams, stored_bytes + state_bytes
                )
        except TieredError as exc:
            self._refused(bucket, str(exc.context.get("quota")))
            raise
        if not rated:
            return
        now = self.clock.now_ms()
        takes: list[tuple[TokenBucket, int]] = []
        for quota, limit, cost in (
            ("append_requests_per_s", quotas.append_requests_per_s, 1),
            ("append_bytes_per_s", quotas.append_bytes_per_s, stored_bytes),
        ):
            if limit is None or cost == 0:
                continue
            tb = self._rate(bucket, quota, limit, now)
            wait = tb.wait_ms(cost, now)
            if wait != 0:
                self._refused(bucket, quota)
                raise q.rate_limited(quota, limit, retry_after_s(wait))
            takes.append((tb, cost))
        for tb, cost in takes:  # only once every rate passed: a refusal takes nothing
            tb.take(cost, now)

    def enter_live(self, bucket: str) -> None:
        limit = self.quotas(bucket).max_live_readers
        count = self.live.get(bucket, 0)
        if limit is not None and count >= limit:
            self._refused(bucket, "max_live_readers")
            raise q.rate_limited("max_live_readers", limit, LIVE_RETRY_AFTER_S)
        self.live[bucket] = count + 1

    def leave_live(self, bucket: str) -> None:
        count = self.live.get(bucket, 0) - 1
        if count > 0:
            self.live[bucket] = count
        else:
            self.live.pop(bucket, None)
