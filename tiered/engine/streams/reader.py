"""The read path: bytes of a stream stitched from hot segments and cold objects, every byte checked.

Hot records are checksum-checked once (``SegmentLog``); a segment nobody
checked since start-up is checked on a worker thread first, never on the
event loop. Cold reads are bounded by a deadline and check every fetched
byte against the digests in the object's index (``cold_read``). Damage on
either tier is ``DATA_DAMAGED`` (counted and logged with where it is); an
object store that does not answer is ``STORE_UNAVAILABLE`` (the HTTP layer
adds when to retry).
"""

from __future__ import annotations

import asyncio
import logging
from bisect import bisect_right
from collections.abc import Callable

from tiered.cold.parquet.reader import ColdReader
from tiered.core.errors import ErrorCode, TieredError
from tiered.core.ids import format_offset
from tiered.core.ports import StoreHealth
from tiered.engine.streams import keyed
from tiered.engine.streams.cold_read import damaged, read_cold
from tiered.engine.streams.model import ColdSlice, Stream
from tiered.engine.streams.payload_read import read_payload_slice
from tiered.engine.streams.state import StreamState
from tiered.hot.log import SegmentLog, SegmentUnchecked
from tiered.hot.segment import DamagedRecordError

log = logging.getLogger(__name__)


class StreamReader:
    def __init__(
        self,
        state: StreamState,
        hot: SegmentLog,
        cold: ColdReader | None,
        store_health: StoreHealth,
        *,
        cold_read_timeout_s: float,
        on_egress: Callable[[str, int, int], None] | None = None,
    ) -> None:
        self.state = state
        self.hot = hot
        self.cold = cold
        self.store_health = store_health
        self.cold_read_timeout_s = cold_read_timeout_s
        self.integrity_errors = {"hot": 0, "cold": 0}  # reads refused for damage
        # Usage: bytes served, by the bucket of the stream read and the tier they came from.
        self.on_egress = on_egress

    async def read(self, s: Stream, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of a stream (callers stay within the visible tail)."""
        while True:
            try:
                return await self._read(s, start, end)
            except SegmentUnchecked as exc:
                # First read of a segment recovery did not check: verify it off the loop, then re-plan.
                await asyncio.to_thread(self.hot.check_segment, exc.segment)
            except DamagedRecordError as exc:
                self.integrity_errors["hot"] += 1
                log.error(
                    "integrity: hot read of %s/%s [%d, %d) hit damaged %s", s.bucket, s.path, start, end, exc
                )
                raise damaged(
                    f"stored data of this stream is damaged (hot segment {exc.segment}, byte {exc.position}); "
                    "it will not be served"
                ) from None

    async def _read(self, s: Stream, start: int, end: int) -> bytes:
        if start < end and (s.holes or s.fork_source is not None):
            hole = keyed.hole_read(self.state, s, start, end)
            if hole is not None:
                # Removed by keyed compaction, not damaged: refused before any fetch (a rewritten
                # object no longer holds these bytes), never counted as an integrity error.
                raise TieredError(
                    ErrorCode.OFFSET_GONE,
                    f"bytes [{max(start, hole[0])}, {min(end, hole[1])}) of this stream were removed "
                    "by keyed compaction (reads skip them)",
                    next_offset=format_offset(hole[1]),
                )
        c = s.chunks
        hot = self.hot
        if c.starts and start >= c.starts[0] and (s.fork_source is None or start >= s.fork_offset):
            # All hot, all the stream's own: the common catch-up case, no slice objects.
            i = bisect_right(c.starts, start) - 1
            data = hot.read_run(c.starts, c.lens, c.segs, c.poss, i, start, end)
            if len(data) == end - start:  # else a large body stored by reference lies in between: plan it
                if self.on_egress is not None:
                    self.on_egress(s.bucket, len(data), 0)
                return data
        slices = self.state.plan_read(s, start, end)
        # Hot slices first, with no await in between: a segment the plan names
        # cannot be trimmed and deleted while cold reads are in flight.
        parts: list[bytes | None] = [
            None
            if isinstance(sl, ColdSlice)
            else hot.read(sl.segment, sl.position, sl.length, inline_check=False)
            for sl in slices
        ]
        cold = [(i, sl) for i, sl in enumerate(slices) if isinstance(sl, ColdSlice)]
        if cold:
            # Ranged GETs of different objects overlap rather than queue.
            fetched = await asyncio.gather(*(self._read_cold(sl) for _, sl in cold))
            for (i, _), data in zip(cold, fetched, strict=True):
                parts[i] = data
        if self.on_egress is not None:
            cold_bytes = sum(len(parts[i] or b"") for i, _ in cold)
            hot_bytes = sum(len(p or b"") for p in parts) - cold_bytes
            self.on_egress(s.bucket, hot_bytes, cold_bytes)
        data = (parts[0] or b"") if len(parts) == 1 else b"".join(p or b"" for p in parts)
        if s.holes and len(data) != end - start:
            # Holes are refused above; a live range answered short is never served as it is.
            raise damaged(f"bytes [{start}, {end}) of this stream were not all found")
        return data

    async def _read_cold(self, sl: ColdSlice) -> bytes:
        obj = self.state.cold_objects.get(sl.key)
        if obj is None or self.cold is None:
            raise TieredError(
                ErrorCode.COLD_NOT_READY, "cold data is not available right now", retry_after_s=1
            )
        cold = self.cold

        def counted() -> None:
            self.integrity_errors["cold"] += 1

        if obj.payload is not None:  # a large body stored by reference: its raw bytes, checked per block
            return await read_cold(
                lambda: read_payload_slice(cold.store, obj, sl.start, sl.end),
                sl,
                timeout_s=self.cold_read_timeout_s,
                on_damaged=counted,
                health=self.store_health,
            )
        return await read_cold(
            lambda: cold.read(sl.key, obj.index, sl.bucket, sl.path, sl.start, sl.end),
            sl,
            timeout_s=self.cold_read_timeout_s,
            on_damaged=counted,
            health=self.store_health,
        )
