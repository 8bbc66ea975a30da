"""Moving durable hot data to the cold tier, through a journaled lifecycle (the flusher job).

One pass packs the durable, not-yet-cold bytes of every stream into Parquet
objects (``flush_plan``):

1. the hot bytes are read, each record checked against its checksum (a
   damaged record cuts its stream's piece short: damage never travels);
2. ``ColdCopyStarted(key, ranges)`` is journaled (a crash after this leaves a
   known key that reconciliation can clean up);
3. the object is uploaded with create-if-absent;
4. ``ColdCopyCommitted(key, index, ranges)`` is journaled: from here reads of
   those ranges may come from the object;
5. only then are hot copies trimmed (after the configured hot retention), and
   hot segment files nothing references any more are deleted.

A crash between any two steps loses nothing: until step 4 the hot copy is the
only copy and stays; after it both exist until step 5. The flusher depends
on small ports (``tiered.core.ports``), not on the service.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from tiered.cold.objects.keys import new_object_key
from tiered.cold.objects.store import ObjectStore, ObjectStoreError
from tiered.cold.parquet.chunk import ColdRecord, encode_chunk
from tiered.core.clock import Clock
from tiered.core.ports import Committer, HotReader, PrefixOwner, SegmentReaper
from tiered.engine.jobs.flush_plan import PieceToCopy, plan_flush, plan_hot_trims
from tiered.engine.streams import integrity
from tiered.engine.streams.model import Stream
from tiered.engine.streams.records import (
    ColdCopyAborted,
    ColdCopyCommitted,
    ColdCopyStarted,
    CopyRange,
    HotTrimmed,
)
from tiered.engine.streams.state import StreamState
from tiered.hot.segment import DamagedRecordError, crc32c

log = logging.getLogger(__name__)

#: A flush reads hot records in runs (``ColdFlusher._read_runs``): records at most this far apart share one
#: read, and one read spans at most ``RUN_BYTES``.
RUN_GAP_BYTES = 64 * 1024
RUN_BYTES = 8 * 1024 * 1024

#: The flusher's thread lets the event loop's thread take the GIL after this many records of Python work.
#: A pass walks a second's appends; read in runs it makes few system calls (each of which let the loop in),
#: so the loop would otherwise wait out the interpreter's switch interval (5 ms) again and again while
#: requests queue behind it.
#: Measured (bench/compare.py, 3 runs each, quiet machine): append p99 20.4 ms without, 14.9 ms with
#: (records read one by one, as before runs, gave 14.1 ms at more system time).
YIELD_EVERY_RECORDS = 256


class _Yielder:
    """Counts records of Python work on a worker thread and sleeps briefly every ``YIELD_EVERY_RECORDS``."""

    __slots__ = ("_n",)

    def __init__(self) -> None:
        self._n = 0

    def tick(self) -> None:
        self._n += 1
        if self._n >= YIELD_EVERY_RECORDS:
            self._n = 0
            time.sleep(0)  # releases the GIL: the loop's thread, when waiting for it, is woken


class ColdFlusher:
    """Runs flush passes and hot-copy cleanup (``run`` is the background job the node starts)."""

    def __init__(
        self,
        state: StreamState,
        visible_tail: Callable[[Stream], int],
        committer: Committer,
        hot: HotReader,
        reaper: SegmentReaper,
        store: ObjectStore,
        clock: Clock,
        *,
        interval_s: float,
        flush_bytes: int,
        target_object_bytes: int,
        hot_retention_s: float,
        max_pass_bytes: int | None = None,
        claim: PrefixOwner | None = None,
    ) -> None:
        self.state = state
        self.visible_tail = visible_tail
        self.committer = committer
        self.hot = hot
        self.reaper = reaper
        self.store = store
        self.clock = clock
        self.claim = claim
        self.interval_s = interval_s
        self.flush_bytes = flush_bytes
        self.target_object_bytes = target_object_bytes
        self.hot_retention_ms = int(hot_retention_s * 1000)
        self.max_pass_bytes = max_pass_bytes or 4 * target_object_bytes
        self._kick = asyncio.Event()
        # uid -> stream offset of a hot record that failed its checksum: the stream
        # flushes up to it and no further, until retention or deletion lets it go.
        self.damaged: dict[int, int] = {}
        self.objects_uploaded = 0
        self.bytes_uploaded = 0
        self.puts = 0
        self.damaged_found = 0
        self.failures = 0
        self.last_error: str | None = None

    def kick(self) -> None:
        """Ask for an early pass (enough unflushed bytes have piled up)."""
        self._kick.set()

    async def run(self) -> None:
        await self.abort_interrupted_copies()
        backoff = self.interval_s
        while True:
            if backoff > self.interval_s:
                await asyncio.sleep(backoff)  # the store is failing: kicks must not bypass backoff
            else:
                try:
                    async with asyncio.timeout(self.interval_s):  # not wait_for: it can swallow a cancel
                        await self._kick.wait()
                except TimeoutError:
                    pass
            self._kick.clear()
            try:
                while await self.flush_once():
                    if self.state.hot_bytes < self.flush_bytes:
                        break
                await self.release_hot_copies()
                backoff = self.interval_s
                self.last_error = None
            except ObjectStoreError as exc:
                self.failures += 1
                self.last_error = str(exc)
                backoff = min(max(backoff * 2, 1.0), 30.0)
                log.warning("cold flush failed (retrying in %.0fs): %s", backoff, exc)
            except asyncio.CancelledError:
                raise
            except Exception:
                self.failures += 1
                backoff = min(max(backoff * 2, 1.0), 30.0)
                log.exception("cold flush pass crashed; retrying in %.0fs", backoff)

    async def abort_interrupted_copies(self) -> None:
        """Copies started before a restart never committed: mark them abandoned."""
        pending = list(self.state.copies_in_flight)
        if pending:
            now = self.clock.now_ms()
            await self.committer.commit(
                [ColdCopyAborted(key=k, ts_ms=now, reason="interrupted by restart") for k in pending]
            )
            log.info(
                "abandoned %d cold copies interrupted by a restart (orphans for reconciliation)", len(pending)
            )

    async def flush_once(self) -> int:
        """One bounded pass; returns how many objects were committed."""
        if self.claim is not None and not await self.claim.still_held():
            return 0  # another data dir owns the prefix now: write nothing there
        self._forget_released_damage()
        plans = plan_flush(
            self.state,
            self.visible_tail,
            target_bytes=self.target_object_bytes,
            max_pass_bytes=self.max_pass_bytes,
            damaged=self.damaged,
        )
        committed = 0
        previous = 0
        half = self.target_object_bytes // 2
        for n, pieces in enumerate(plans):
            size = sum(p.end - p.start for p in pieces)
            if n == len(plans) - 1 and previous >= half and size < half:
                break  # a small remainder after a full object waits for the next pass to fill up
            if await self._copy(pieces):
                committed += 1
            previous = size
        return committed

    def _forget_released_damage(self) -> None:
        for uid, offset in list(self.damaged.items()):
            s = self.state.streams.get(uid)
            if s is None or s.cold_end > offset or s.keep_start > offset:
                del self.damaged[uid]  # the damaged record is no longer needed by any reader

    async def _copy(self, pieces: list[PieceToCopy]) -> bool:
        """Copy ``pieces`` into one new object; False if damage left nothing to copy."""
        # Read (and checksum) the hot bytes first: a damaged record cuts its piece short.
        # The journal's digest of each hot record (taken here, on the loop that changes them): the
        # object's footer records those, so verify checks the uploaded rows against what was acknowledged.
        digests = {p.stream.uid: integrity.hot_records(p.stream) for p in pieces}  # a list copy each
        records, pieces = await asyncio.to_thread(self._load_records, pieces, digests)
        if not pieces:
            return False
        now = self.clock.now_ms()
        key = new_object_key(now)
        ranges = tuple(CopyRange(p.stream.uid, p.start, p.end) for p in pieces)
        await self.committer.commit([ColdCopyStarted(key=key, ts_ms=now, ranges=ranges)])
        try:
            data, index = await asyncio.to_thread(encode_chunk, records, row_group_bytes=1 << 20)
            await self.store.put(key, data)
            self.puts += 1
        except BaseException as exc:
            reason = f"upload failed: {exc!r}"[:500]
            try:
                await self.committer.commit(
                    [ColdCopyAborted(key=key, ts_ms=self.clock.now_ms(), reason=reason)]
                )
            except Exception:
                log.exception("could not journal the abort of %s", key)
            raise
        await self.committer.commit(
            [
                ColdCopyCommitted(
                    key=key,
                    ts_ms=self.clock.now_ms(),
                    size=len(data),
                    crc32c=crc32c(data),
                    index=index,
                    ranges=ranges,
                )
            ]
        )
        self.objects_uploaded += 1
        self.bytes_uploaded += len(data)
        return True

    def _load_records(
        self, pieces: list[PieceToCopy], digests: dict[int, list[tuple[int, int, int]]] | None = None
    ) -> tuple[list[ColdRecord], list[PieceToCopy]]:
        """The records of ``pieces`` (worker thread), each checked against its checksum, with its digest
        from ``digests`` (each stream's ``integrity.hot_records``).

        A piece stops before a damaged record; the stream is remembered in
        ``damaged`` so later passes do not try again.
        """
        read = self.hot.read
        prefetched = self._read_runs(pieces)
        out: list[ColdRecord] = []
        kept: list[PieceToCopy] = []
        pause = _Yielder()
        for p in pieces:
            s = p.stream
            loaded: list[ColdRecord] = []
            hot = digests.get(s.uid, []) if digests is not None else []
            known = integrity.digests_of(hot, ((start, start + length) for start, length, *_ in p.chunks))
            for (start, length, seg, pos, ts), digest in zip(p.chunks, known, strict=True):
                pause.tick()
                try:
                    data = prefetched.get((seg, pos))
                    if data is None or len(data) != length:
                        data = read(seg, pos, length)  # not in a run read whole (or damage near it)
                    loaded.append(
                        ColdRecord(s.bucket, s.path, start, start + length, ts, data, s.incarnation, digest)
                    )
                except DamagedRecordError as exc:
                    self.damaged[s.uid] = start
                    self.damaged_found += 1
                    log.error(
                        "integrity: not copying %s/%s from offset %d to the cold tier: %s (the stream keeps "
                        "its data hot from there; reads of the damaged record fail)",
                        s.bucket,
                        s.path,
                        start,
                        exc,
                    )
                    break
            if loaded:
                out.extend(loaded)
                kept.append(PieceToCopy(s, p.start, loaded[-1].end_offset, p.chunks[: len(loaded)]))
        return out, kept

    def _read_runs(self, pieces: list[PieceToCopy]) -> dict[tuple[int, int], bytes]:
        """The records of ``pieces`` by ``(segment, position)``, read in runs (worker thread).

        Records written close together (the appends of many streams interleave in the log) are read
        with one ``pread`` per run (gaps under ``RUN_GAP_BYTES``, runs up to ``RUN_BYTES``) rather than
        one per record, then sliced: a flush pass otherwise pays a system call per appended record.
        The run's range is checked as a record's is (checksums, damage); a run that meets damage is
        left out, and its records are read one by one, so a damaged record cuts its piece as before.
        """
        wanted = sorted((seg, pos, length) for p in pieces for _, length, seg, pos, _ in p.chunks)
        pause = _Yielder()
        out: dict[tuple[int, int], bytes] = {}
        i, n = 0, len(wanted)
        while i < n:
            seg, lo, length = wanted[i]
            hi, j = lo + length, i + 1
            while j < n:
                nseg, npos, nlen = wanted[j]
                if nseg != seg or npos - hi > RUN_GAP_BYTES or npos + nlen - lo > RUN_BYTES:
                    break
                hi = max(hi, npos + nlen)
                j += 1
            if j - i > 1:
                try:
                    run = self.hot.read(seg, lo, hi - lo)
                except DamagedRecordError:
                    run = None
                if run is not None:
                    for _, pos, size in wanted[i:j]:
                        pause.tick()
                        out[(seg, pos)] = run[pos - lo : pos - lo + size]
            i = j
        return out

    async def release_hot_copies(self) -> None:
        """Trim hot copies that are cold and past retention; delete unreferenced segments."""
        now = self.clock.now_ms()
        trims = plan_hot_trims(self.state, now, self.hot_retention_ms)
        if trims:
            await self.committer.commit([HotTrimmed(ts_ms=now, trims=tuple(trims))])
        await self.reaper.delete_unreferenced()
