"""Moving sealed hot data to the cold tier: ``flush_sealed_segments`` and friends.

One pass packs the durable, not-yet-cold bytes of every stream into Parquet
objects, following a journaled lifecycle:

1. ``ColdCopyStarted(key, ranges)`` is journaled (a crash after this leaves a
   known key that reconciliation can clean up);
2. the object is uploaded with create-if-absent;
3. ``ColdCopyCommitted(key, index, ranges)`` is journaled: from here reads of
   those ranges may come from the object;
4. only then are hot copies trimmed (after the configured hot retention), and
   hot segment files nothing references any more are deleted.

A crash between any two steps loses nothing: until step 3 the hot copy is the
only copy and stays; after it both exist until step 4.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from bisect import bisect_right
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tiered.hot.segment import DamagedRecordError, crc32c
from tiered.records import ColdCopyAborted, ColdCopyCommitted, ColdCopyStarted, CopyRange, HotTrimmed, Record
from tiered.state import Stream, StreamState

from .parquet_chunk import ColdRecord, encode_chunk
from .store import ObjectStore, ObjectStoreError

log = logging.getLogger(__name__)

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_object_key(now_ms: int, randomness: bytes | None = None) -> str:
    """``data/<ULID>.parquet``: keys sort by creation time, so age shows in the name."""
    rand = int.from_bytes(randomness or os.urandom(10), "big")
    value = (now_ms << 80) | rand
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "data/" + "".join(reversed(chars)) + ".parquet"


def key_time_ms(key: str) -> int | None:
    """The creation time encoded in a key from ``new_object_key``."""
    name = key.rsplit("/", 1)[-1].removesuffix(".parquet")
    if len(name) != 26:
        return None
    value = 0
    for ch in name:
        i = _CROCKFORD.find(ch)
        if i < 0:
            return None
        value = (value << 5) | i
    return value >> 80


@dataclass(frozen=True, slots=True)
class PieceToCopy:
    """One stream's range in a planned object, with where its records live."""

    stream: Stream
    start: int
    end: int
    chunks: list[tuple[int, int, int, int, int]]  # (start, length, segment, position, ts_ms)


def plan_flush(
    state: StreamState,
    visible_tail: Callable[[Stream], int],
    *,
    target_bytes: int,
    max_pass_bytes: int,
    damaged: Mapping[int, int] | None = None,
) -> list[list[PieceToCopy]]:
    """Group not-yet-cold durable data into objects (pure; reads state only).

    Streams with at least half a target of data get objects of their own (cut
    at record boundaries); the rest are packed together, so a thousand quiet
    streams cost one PUT. ``damaged`` maps uids to the offset of a hot record
    that failed its checksum: nothing from there on is copied.
    """
    big: list[list[PieceToCopy]] = []
    small: list[PieceToCopy] = []
    budget = max_pass_bytes
    for s in sorted(state.streams.values(), key=lambda st: st.uid):
        if budget <= 0:
            break
        end = visible_tail(s)
        if s.keep_end is not None:
            end = min(end, s.keep_end)  # past it no reader can reach: never copy it
        bad = damaged.get(s.uid) if damaged else None
        if bad is not None and bad >= s.cold_end:
            end = min(end, bad)  # damage never travels to the cold tier
        if end <= s.cold_end:
            continue
        c = s.chunks
        i = max(0, bisect_right(c.starts, s.cold_end) - 1)
        chunks = []
        size = 0
        while i < len(c) and c.starts[i] < end and size < budget:
            start, length, pos = c.starts[i], c.lens[i], c.poss[i]
            if start < s.cold_end < start + length:
                # Retention released the front of this record: copy only the rest.
                pos += s.cold_end - start
                length -= s.cold_end - start
                start = s.cold_end
            if start >= s.cold_end:
                chunks.append((start, length, c.segs[i], pos, c.times[i]))
                size += length
            i += 1
        if not chunks or chunks[0][0] != s.cold_end:
            continue  # hot copies of the next range are not where they should be; skip
        budget -= size
        if size >= target_bytes // 2:
            piece: list[tuple[int, int, int, int, int]] = []
            piece_bytes = 0
            for ch in chunks:
                if piece and piece_bytes + ch[1] > target_bytes:
                    big.append([_piece(s, piece)])
                    piece, piece_bytes = [], 0
                piece.append(ch)
                piece_bytes += ch[1]
            if piece:
                big.append([_piece(s, piece)])
        else:
            small.append(_piece(s, chunks))
    objects = big
    current: list[PieceToCopy] = []
    current_bytes = 0
    names: set[tuple[str, str]] = set()
    for p in small:
        size = p.end - p.start
        name = (p.stream.bucket, p.stream.path)
        # An object names streams by (bucket, path); a soft-deleted source and
        # the new stream at its path must not share one.
        if current and (current_bytes + size > target_bytes or name in names):
            objects.append(current)
            current, current_bytes, names = [], 0, set()
        current.append(p)
        current_bytes += size
        names.add(name)
    if current:
        objects.append(current)
    return objects


def _piece(s: Stream, chunks: list[tuple[int, int, int, int, int]]) -> PieceToCopy:
    return PieceToCopy(s, chunks[0][0], chunks[-1][0] + chunks[-1][1], chunks)


def plan_hot_trims(state: StreamState, now_ms: int, retention_ms: int) -> list[tuple[int, int]]:
    """(uid, offset) pairs: hot copies below offset are cold and past retention."""
    trims = []
    for s in state.streams.values():
        c = s.chunks
        if not c.starts or c.starts[0] >= s.cold_end:
            continue
        upto = None
        for i in range(len(c)):
            chunk_end = c.starts[i] + c.lens[i]
            if chunk_end > s.cold_end or c.times[i] + retention_ms > now_ms:
                break
            upto = chunk_end
        if upto is not None:
            trims.append((s.uid, upto))
    return trims


class ColdFlusher:
    """The background job that runs flush passes and hot-segment cleanup."""

    def __init__(
        self,
        service,  # tiered.service.StreamService (not imported: it imports us)  # type: ignore[no-untyped-def]
        store: ObjectStore,
        *,
        interval_s: float,
        flush_bytes: int,
        target_object_bytes: int,
        hot_retention_s: float,
        max_pass_bytes: int | None = None,
    ) -> None:
        self.service = service
        self.store = store
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
        self._last_snapshot_request = 0.0

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
                    if self.service.state.hot_bytes < self.flush_bytes:
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
        pending = list(self.service.state.copies_in_flight)
        if pending:
            now = int(time.time() * 1000)
            await self.service.commit_records(
                [ColdCopyAborted(key=k, ts_ms=now, reason="interrupted by restart") for k in pending]
            )
            log.info("abandoned %d cold copies interrupted by a restart (orphans for reconciliation)", len(pending))

    async def flush_once(self) -> int:
        """One bounded pass; returns how many objects were committed."""
        service = self.service
        claim = getattr(service, "claim", None)
        if claim is not None and not await claim.still_held():
            return 0  # another data dir owns the prefix now: write nothing there
        self._forget_released_damage()
        plans = plan_flush(
            service.state,
            lambda s: service.view(s).tail,
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
        state = self.service.state
        for uid, offset in list(self.damaged.items()):
            s = state.streams.get(uid)
            if s is None or s.cold_end > offset or s.keep_start > offset:
                del self.damaged[uid]  # the damaged record is no longer needed by any reader

    async def _copy(self, pieces: list[PieceToCopy]) -> bool:
        """Copy ``pieces`` into one new object; False if damage left nothing to copy."""
        service = self.service
        # Read (and checksum) the hot bytes first: a damaged record cuts its piece short.
        records, pieces = await asyncio.to_thread(self._load_records, pieces)
        if not pieces:
            return False
        now = int(time.time() * 1000)
        key = new_object_key(now)
        ranges = tuple(CopyRange(p.stream.uid, p.start, p.end) for p in pieces)
        await service.commit_records([ColdCopyStarted(key=key, ts_ms=now, ranges=ranges)])
        try:
            data, index = await asyncio.to_thread(encode_chunk, records, row_group_bytes=1 << 20)
            await self.store.put(key, data)
            self.puts += 1
        except BaseException as exc:
            reason = f"upload failed: {exc!r}"[:500]
            try:
                await service.commit_records([ColdCopyAborted(key=key, ts_ms=int(time.time() * 1000), reason=reason)])
            except Exception:
                log.exception("could not journal the abort of %s", key)
            raise
        await service.commit_records(
            [
                ColdCopyCommitted(
                    key=key,
                    ts_ms=int(time.time() * 1000),
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

    def _load_records(self, pieces: list[PieceToCopy]) -> tuple[list[ColdRecord], list[PieceToCopy]]:
        """The records of ``pieces`` (worker thread), each checked against its checksum.

        A piece stops before a damaged record; the stream is remembered in
        ``damaged`` so later passes do not try again.
        """
        read = self.service.journal.log.read
        out: list[ColdRecord] = []
        kept: list[PieceToCopy] = []
        for p in pieces:
            s = p.stream
            loaded: list[ColdRecord] = []
            for start, length, seg, pos, ts in p.chunks:
                try:
                    loaded.append(ColdRecord(s.bucket, s.path, start, start + length, ts, read(seg, pos, length)))
                except DamagedRecordError as exc:
                    self.damaged[s.uid] = start
                    self.damaged_found += 1
                    log.error(
                        "integrity: not copying %s/%s from offset %d to the cold tier: %s (the stream keeps "
                        "its data hot from there; reads of the damaged record fail)", s.bucket, s.path, start, exc,
                    )
                    break
            if loaded:
                out.extend(loaded)
                kept.append(PieceToCopy(s, p.start, loaded[-1].end_offset, p.chunks[: len(loaded)]))
        return out, kept

    async def release_hot_copies(self) -> None:
        """Trim hot copies that are cold and past retention; delete unreferenced segments."""
        service = self.service
        now = int(time.time() * 1000)
        trims = plan_hot_trims(service.state, now, self.hot_retention_ms)
        if trims:
            records: list[Record] = [HotTrimmed(ts_ms=now, trims=tuple(trims))]
            await service.commit_records(records)
        await service.delete_unreferenced_segments()
