"""Rewriting one cold object without the rows nobody reads, through a journaled lifecycle.

The machinery erasure (``tiered.gc.erasure``) and keyed compaction
(``tiered.gc.reclaim``) use: given an object, keep the rows some stream range
still reads (``rewrite_plan``), optionally filtered further, and swap the
ranges to the new object. Records wholly inside a stream's holes (removed by
keyed compaction) are not copied, and their digests are released with the
commit (``ColdRewriteCommitted.dropped``); a range wholly inside holes is
released rather than copied (``ColdHolesReleased``, in the same journal batch
as the commit, or alone when no range of the object needs a copy). The steps,
each safe to crash after:

1. the old object is read whole and checked against the size and CRC32C the
   metadata recorded (then every Parquet page checksum as it decodes): a
   damaged object is an integrity error and is never rewritten; decoding and
   encoding the new object run in a worker process, off the event loop and
   its GIL;
2. ``ColdCopyStarted(new_key, ())`` is journaled (intent: a crash from here on
   leaves a known key; a restart journals it aborted and reconciliation
   deletes the upload, if any, after the grace delay);
3. the new object is uploaded create-if-absent (upload before commit);
4. ``ColdRewriteCommitted(old_key, new_key, ranges)`` is journaled (commit
   before release): the ranges that still read from the old object move to
   the new one; the old object loses those owners;
5. the old object, once nobody owns it, is deleted by the GC's
   ``cold_objects`` task after the grace delay (journal before delete), so a
   read planned against it before the swap still finds it.

Until step 4 the old object serves every read; after it the new one does and
the old one still exists: no byte acknowledged is lost, none is served twice
(one range reads from one object). The pass is bounded by its caller, and
idempotent: an object whose rows are all read is never a candidate again.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import msgspec

from tiered.cold.objects.keys import new_object_key
from tiered.cold.objects.store import ObjectStore
from tiered.cold.parquet.chunk import ChunkIndex, ColdDataDamaged, ColdRecord, encode_chunk, row_groups
from tiered.core.clock import Clock
from tiered.core.ports import Committer
from tiered.core.record_digest import MASK, RecordHasher, digest_bytes
from tiered.engine.jobs.rewrite_plan import KeptRange, RewriteMismatch, in_holes, plan_rewrite, select_rows
from tiered.engine.streams.records import (
    ColdCopyAborted,
    ColdCopyStarted,
    ColdHolesReleased,
    ColdRewriteCommitted,
    CopyRange,
    DroppedRows,
)
from tiered.engine.streams.state import StreamState
from tiered.hot.segment import crc32c

log = logging.getLogger(__name__)

ROW_GROUP_BYTES = 1 << 20


@dataclass(frozen=True)
class Rewritten:
    """One rewrite done: the old object's ranges read from ``new_key`` (``bytes_*``: object sizes).

    ``new_key`` is None when every range the old object served lay in holes: its references were
    released with no copy, so nothing was read or written (``bytes_moved`` is 0, nothing to pace).
    """

    old_key: str
    new_key: str | None
    bytes_before: int
    bytes_after: int
    ranges: int

    @property
    def bytes_moved(self) -> int:
        """Bytes read plus written (what ``rewrite_bytes_per_s`` paces)."""
        return 0 if self.new_key is None else self.bytes_before + self.bytes_after


class ObjectRewriter:
    """Rewrites cold objects one at a time (``rewrite``); the caller bounds how many per pass."""

    def __init__(self, state: StreamState, committer: Committer, store: ObjectStore, clock: Clock) -> None:
        self.state = state
        self.committer = committer
        self.store = store
        self.clock = clock
        self.objects_rewritten = 0
        self.bytes_read = 0
        self.bytes_written = 0

    async def rewrite(
        self,
        key: str,
        predicate: Callable[[ColdRecord], bool] | None = None,
        *,
        only_if_reclaims: bool = False,
    ) -> Rewritten | None:
        """Rewrite ``key`` keeping the rows still read (and passing ``predicate``); None: nothing to do.

        Rows wholly inside their stream's holes (keyed compaction) are not copied
        and their digests are released with the commit (``DroppedRows``); a range
        wholly inside holes is released instead of copied (``ColdHolesReleased``;
        when that is every range, nothing is uploaded). ``only_if_reclaims``: do
        nothing (None) unless some hole bytes go (a compaction pass asks this).

        Raises ``ColdDataDamaged`` (the object is not what was written),
        ``RewriteMismatch`` (its rows do not tile a range it serves) or an
        ``ObjectStoreError``; each leaves the old object serving as before.
        """
        plan = plan_rewrite(self.state, key)
        if plan is None:
            return None
        copy = tuple(k for k in plan.keep if not in_holes(k))
        gone = tuple(CopyRange(k.uid, k.start, k.end) for k in plan.keep if in_holes(k))
        obj = self.state.cold_objects[key]
        if not copy:  # every range it serves lies in holes: released, nothing to upload
            await self.committer.commit(
                [ColdHolesReleased(old_key=key, ts_ms=self.clock.now_ms(), ranges=gone)]
            )
            log.info("cold object %s: its %d stream ranges lie in compaction holes, released", key, len(gone))
            return Rewritten(key, None, obj.size, 0, 0)  # released, no copy: nothing read or written
        data = await self.store.get(key)
        self.bytes_read += len(data)
        new_data, index, new_crc, dropped_sums = await _in_worker(
            key, data, (obj.size, obj.crc32c), copy, predicate
        )
        if only_if_reclaims and not gone and not dropped_sums:
            return None
        now = self.clock.now_ms()
        new_key = new_object_key(now)
        await self.committer.commit([ColdCopyStarted(key=new_key, ts_ms=now, ranges=())])
        try:
            await self.store.put(new_key, new_data)
        except BaseException as exc:
            reason = f"rewrite upload failed: {exc!r}"[:500]
            try:
                await self.committer.commit(
                    [ColdCopyAborted(key=new_key, ts_ms=self.clock.now_ms(), reason=reason)]
                )
            except Exception:
                log.exception("could not journal the abort of %s", new_key)
            raise
        ranges = tuple(CopyRange(k.uid, k.start, k.end) for k in copy)
        dropped = tuple(
            DroppedRows(copy[i].uid, copy[i].start, digest_bytes(d), n, size)
            for i, d, n, size in dropped_sums
        )
        ts = self.clock.now_ms()
        committed: list[ColdRewriteCommitted | ColdHolesReleased] = [
            ColdRewriteCommitted(
                old_key=key,
                new_key=new_key,
                ts_ms=ts,
                size=len(new_data),
                crc32c=new_crc,
                index=index,
                ranges=ranges,
                dropped=dropped,
            )
        ]
        if gone:
            committed.append(ColdHolesReleased(old_key=key, ts_ms=ts, ranges=gone))
        await self.committer.commit(committed)
        self.objects_rewritten += 1
        self.bytes_written += len(new_data)
        log.info(
            "cold object %s rewritten as %s (%d -> %d bytes, %d stream ranges, %d released in holes)",
            key,
            new_key,
            len(data),
            len(new_data),
            len(ranges),
            len(gone),
        )
        return Rewritten(key, new_key, len(data), len(new_data), len(ranges))


DroppedSum = tuple[int, int, int, int]  # index of the kept range, digest sum, records, bytes
Encoded = tuple[bytes, ChunkIndex, int, list[DroppedSum]]

# One worker process does the rewrites' decoding and encoding: in a thread they held the GIL in
# slices long enough to stall the event loop (appends fell to a fifth while a rewrite ran,
# docs/benchmarks.md). Started on first use ("spawn": the server's threads are not forked), and
# again after it died. It runs at a lower CPU priority (nice +10): on a machine whose cores the
# appends already use, background work takes what they leave rather than half of a core.
_pool: ProcessPoolExecutor | None = None
WORKER_NICENESS = 10


def _worker_pool() -> ProcessPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ProcessPoolExecutor(
            max_workers=1, mp_context=multiprocessing.get_context("spawn"), initializer=_lower_priority
        )
    return _pool


def _lower_priority() -> None:
    """In the worker process: yield the CPU to the server's own threads (a best effort: where the
    platform refuses, the worker runs at the server's priority)."""
    try:
        os.nice(WORKER_NICENESS)
    except (AttributeError, OSError):
        pass


async def in_worker(fn: Callable[..., tuple[str, Any]], *args: Any) -> tuple[str, Any]:
    """``fn(*args)`` in the worker process (keyed compaction's decision runs here too)."""
    global _pool
    loop = asyncio.get_running_loop()
    try:
        return await loop.run_in_executor(_worker_pool(), fn, *args)
    except BrokenProcessPool:
        _pool = None  # the worker died (killed, out of memory): the next call starts a new one
        raise


async def _in_worker(
    key: str,
    data: bytes,
    recorded: tuple[int, int],
    keep: tuple[KeptRange, ...],
    predicate: Callable[[ColdRecord], bool] | None,
) -> Encoded:
    """``rewrite_bytes`` in the worker process; its refusals raised here as the errors they are."""
    outcome, value = await in_worker(rewrite_bytes, key, data, recorded, keep, predicate)
    if outcome == "damaged":
        raise ColdDataDamaged(key, value)
    if outcome == "mismatch":
        raise RewriteMismatch(value)
    encoded: Encoded = value
    return encoded


def rewrite_bytes(
    key: str,
    data: bytes,
    recorded: tuple[int, int],
    keep: tuple[KeptRange, ...],
    predicate: Callable[[ColdRecord], bool] | None,
) -> tuple[str, Any]:
    """The old object's bytes to the new object's (worker process): ("ok", (bytes, index, crc32c,
    dropped)), or ("damaged" | "mismatch", why): refusals cross the process boundary as values.
    ``dropped``: per kept range that lost rows in its holes, (its index in ``keep``, their digest sum,
    count, bytes)."""
    dropped: dict[KeptRange, list[ColdRecord]] = {}
    try:
        rows = _rows_to_keep(key, data, recorded, keep, predicate, dropped)
    except ColdDataDamaged as exc:
        return "damaged", exc.detail
    except RewriteMismatch as exc:
        return "mismatch", str(exc)
    gaps = any(k.holes for k in keep)
    new_data, index = encode_chunk(rows, row_group_bytes=ROW_GROUP_BYTES, gaps=gaps)
    sums = [
        (i, sum(r.digest or 0 for r in recs) & MASK, len(recs), sum(len(r.payload) for r in recs))
        for i, k in enumerate(keep)
        if (recs := dropped.get(k))
    ]
    return "ok", (new_data, index, crc32c(new_data), sums)


def _rows_to_keep(
    key: str,
    data: bytes,
    recorded: tuple[int, int],
    keep: tuple[KeptRange, ...],
    predicate: Callable[[ColdRecord], bool] | None,
    dropped: dict[KeptRange, list[ColdRecord]],
) -> list[ColdRecord]:
    """Check the whole object's size and CRC32C, decode (page checksums checked) and select. Any
    mismatch or decode failure is damage: never rewritten. Each row carries its digest contribution
    (the footer's, else hashed), so the new footer keeps it and a dropped row's can be released."""
    size, crc = recorded
    if len(data) != size or crc32c(data) != crc:
        raise ColdDataDamaged(key, f"{len(data)} bytes that do not match the recorded size and CRC32C")
    try:
        records = _with_digests(data)
    except Exception as exc:
        raise ColdDataDamaged(key, f"does not decode ({type(exc).__name__}: {exc})") from None
    rows = select_rows(records, keep, predicate, dropped)
    if not rows:
        raise RewriteMismatch(f"{key}: no row left to keep")
    return rows


def _with_digests(data: bytes) -> list[ColdRecord]:
    """Every row of the object, in stored order, with its digest contribution set."""
    digests, groups = row_groups(data)
    hashers: dict[tuple[str, str, int], RecordHasher] = {}
    out: list[ColdRecord] = []
    for g, rows in groups:
        recorded = digests[g] if digests is not None else None
        for i, r in enumerate(rows):
            if recorded is not None:
                h = recorded[i]
            else:
                ident = (r.bucket, r.stream, r.incarnation)
                hasher = hashers.get(ident)
                if hasher is None:
                    hasher = hashers[ident] = RecordHasher(*ident)
                h = hasher(r.start_offset, r.payload)
            out.append(msgspec.structs.replace(r, digest=h))
    return out
