"""Producer expiry: streams nobody appends to any more let go of their idle producers' state.

An append drops its own stream's expired producer states as it applies
(``tiered/engine/streams/producers.py``); this task reaches the other streams, so
the memory, snapshot space and quota bytes (``retained_bytes.producers``) of
producers idle past ``--producer-ttl-s`` are released even on a stream no one
writes again. One ``ProducersExpired`` record per pass, at most
``gc_max_objects_per_pass`` streams.
"""

from __future__ import annotations

from tiered.engine.streams import producers
from tiered.engine.streams.appends import decide_producers_expired
from tiered.gc.context import GcContext, GcPass


class ExpireProducers:
    name = "producers"

    async def run(self, ctx: GcContext, gc_pass: GcPass) -> None:
        state = ctx.state
        record = decide_producers_expired(state, gc_pass.now, ctx.max_objects)
        if record is None:
            return
        limits = state.producer_limits
        gc_pass.report.producer_states_expired = sum(
            len(producers.plan(state.streams[uid].producers, None, record.ts_ms, limits).expired)
            for uid in record.uids
        )
        if not gc_pass.dry_run:
            await ctx.committer.commit([record])
