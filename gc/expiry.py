"""Expiry: streams whose TTL or ``Stream-Expires-At`` passed are journaled as gone (readers already see 404)."""

from __future__ import annotations

from tiered.engine.streams.records import StreamExpired
from tiered.engine.streams.state import StreamState
from tiered.gc.context import GcContext, GcPass


def plan_expirations(state: StreamState, now_ms: int, limit: int) -> list[int]:
    """Uids of streams whose TTL or Expires-At has passed (not yet journaled as gone)."""
    expired = []
    for s in state.streams.values():
        if not s.soft_deleted and s.expired(now_ms):
            expired.append(s.uid)
            if len(expired) >= limit:
                break
    return expired


class ExpireStreams:
    name = "expiry"

    async def run(self, ctx: GcContext, gc_pass: GcPass) -> None:
        expired = plan_expirations(ctx.state, gc_pass.now, ctx.max_objects)
        gc_pass.report.streams_expired = len(expired)
        if expired and not gc_pass.dry_run:
            await ctx.committer.commit([StreamExpired(uid=uid, ts_ms=gc_pass.now) for uid in expired])
