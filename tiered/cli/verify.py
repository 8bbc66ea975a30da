"""``tiered verify``: prove both tiers hold exactly what the metadata says.

Reads the metadata (snapshot + journal, read-only), then:

* every hot segment, frame by frame: each record's checksum (damage is
  reported with the stream ranges that read from it);
* every cold object the metadata references: the object exists with the
  recorded size and checksum; every page checksum verifies and the Parquet
  decodes; the index rebuilt from the object equals the recorded one; and
  for every stream range that reads from the object, its rows cover exactly
  that range, record by record, with payload lengths matching offsets, and
  belong to that stream's incarnation (the ``incarnation`` column; objects
  written before it existed have none to check).

And erasure: no cold object may still hold an erased bucket's bytes past the
erasure deadline (``erasure_deadline_s``; ``tiered.engine.jobs.rewrite_plan``),
save rows a fork in another bucket inherited.
Then every stream's integrity digests (``tiered.cli.verify_digests``): each
hot record's and each cold reference's digest recomputed from the bytes read,
each cold row against the contribution its object's footer recorded, and the
live digest as a whole; a lost, doubled or changed record is named with its
stream and range.

Any mismatch is reported and makes the exit code 1. Nothing is written: the
data dir and the store are opened read-only.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from tiered.cli import verify_digests
from tiered.cold.objects.keys import is_key_index_key, is_snapshot_key
from tiered.cold.objects.payload import PayloadDamaged, PayloadDigest, verify_payload
from tiered.cold.objects.store import ObjectNotFound, ObjectStore, ObjectStoreError
from tiered.cold.parquet.chunk import iter_records, rebuild_index
from tiered.core.clock import SystemClock
from tiered.core.config import Config
from tiered.engine.codec import RECORDS
from tiered.engine.engine import new_state, open_store, producer_limits
from tiered.engine.jobs.rewrite_plan import erasure_report, holes_within
from tiered.engine.journal.journal import Journal
from tiered.engine.journal.snapshot import SnapshotStore
from tiered.engine.snapshot import SNAPSHOTS
from tiered.engine.streams.keyed import continues
from tiered.engine.streams.state import StreamState
from tiered.hot.log import SegmentLog
from tiered.hot.segment import crc32c


@dataclass
class VerifyReport:
    segments: int = 0
    objects: int = 0
    bytes: int = 0
    ranges: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


def load_state_read_only(config: Config) -> StreamState:
    state, log_ = open_read_only(config)
    log_.close()
    return state


def open_read_only(config: Config) -> tuple[StreamState, SegmentLog]:
    """The state (snapshot + journal replay) and the hot log, opened without writing anything."""
    data = config.data_path
    log_ = SegmentLog(data / "hot", segment_bytes=config.segment_bytes)
    journal = Journal(log_, SnapshotStore(data / "snapshots", SNAPSHOTS), RECORDS)
    limits = producer_limits(config)
    return journal.recover(read_only=True, new_state=lambda: new_state(limits)), log_


def verify_hot(state: StreamState, log_: SegmentLog) -> VerifyReport:
    """Check every frame of every hot segment; name the stream ranges damage falls in."""
    report = VerifyReport()
    for seg in log_.segment_ids():
        report.segments += 1
        for d in log_.check_segment(seg):
            readers = [
                f"{s.bucket}/{s.path} [{start}, {start + length})"
                for s in state.streams.values()
                for start, length, sg, pos in zip(
                    s.chunks.starts, s.chunks.lens, s.chunks.segs, s.chunks.poss, strict=True
                )
                if sg == seg and pos < d.end and d.start < pos + length
            ]
            held = "holds " + ", ".join(readers) if readers else "no stream reads it any more"
            report.errors.append(f"hot segment {seg} bytes [{d.start}, {d.end}): {d.reason}; {held}")
    return report


Served = tuple[str, str, int, int, int, tuple[tuple[int, int], ...]]


def _ranges_by_object(state: StreamState) -> dict[str, list[Served]]:
    """Object key -> (bucket, path, incarnation, start, end, holes) of each stream range it serves
    (``holes``: the stream's, keyed compaction's removed ranges, which an object may lack)."""
    by_key: dict[str, list[Served]] = {}
    for s in state.streams.values():
        for ref in s.cold_refs:
            by_key.setdefault(ref.key, []).append(
                (
                    s.bucket,
                    s.path,
                    s.incarnation,
                    ref.start,
                    ref.end,
                    holes_within(s.holes, ref.start, ref.end),
                )
            )
    return by_key


async def verify_cold(
    state: StreamState,
    store: ObjectStore,
    out: TextIO | None = None,
    tally: verify_digests.DigestTally | None = None,
) -> VerifyReport:
    """``tally``: where each object's rows add up their digests (``verify_digests``)."""
    report = VerifyReport()
    by_key = _ranges_by_object(state)
    readers = verify_digests.refs_by_object(state)
    for key in by_key:
        if key not in state.cold_objects:
            report.errors.append(f"{key}: referenced by a stream but unknown to the metadata")
    keys = sorted(state.cold_objects)
    progress = _Progress(len(keys), out)
    for key in keys:
        obj = state.cold_objects[key]
        progress.step(key)
        if obj.payload is not None:  # a large body stored by reference: read a few blocks at a time
            hashes = verify_digests.PayloadHashes(obj.payload_base, obj.payload.size, readers.get(key, {}))
            if await _verify_payload(store, key, obj.payload, report, hashes.update) and tally is not None:
                hashes.add_to(tally)
            continue
        try:
            data = await store.get(key)
        except ObjectNotFound:
            report.errors.append(f"{key}: missing from the object store (metadata references it)")
            continue
        except ObjectStoreError as exc:
            report.errors.append(f"{key}: cannot be read: {exc}")
            continue
        report.objects += 1
        report.bytes += len(data)
        if len(data) != obj.size:
            report.errors.append(f"{key}: size {len(data)} but metadata recorded {obj.size}")
        elif crc32c(data) != obj.crc32c:
            report.errors.append(f"{key}: checksum mismatch (the object changed after upload)")
        if is_snapshot_key(key):
            continue  # a stream snapshot's body: raw bytes, its size and checksum are all there is to check
        if is_key_index_key(key):
            continue  # a header-keyed stream's key index (issue 21): its size and checksum were checked
        if tally is not None:
            verify_digests.tally_object(key, data, readers.get(key, {}), tally)
        try:
            rows: dict[tuple[str, str], list[tuple[int, int, int]]] = {}
            for rec in iter_records(data):
                rows.setdefault((rec.bucket, rec.stream), []).append(
                    (rec.start_offset, rec.end_offset, len(rec.payload))
                )
            rebuilt = rebuild_index(data)
            if rebuilt != obj.index:
                report.errors.append(f"{key}: index rebuilt from the object differs from the recorded index")
        except Exception as exc:  # checksum failure, truncated or foreign file
            report.errors.append(f"{key}: does not decode ({type(exc).__name__}: {exc})")
            continue
        for bucket, path, incarnation, start, end, holes in by_key.get(key, []):
            report.ranges += 1
            problem = _check_range(rows.get((bucket, path), []), start, end, holes)
            entry = rebuilt.find(bucket, path)
            if problem is None and entry is not None and entry.incarnation not in (None, incarnation):
                problem = (
                    f"rows are of incarnation {entry.incarnation}, the stream is incarnation {incarnation}"
                )
            if problem:
                report.errors.append(f"{key}: {bucket}/{path} [{start}, {end}): {problem}")
    progress.done()
    return report


def verify_erasure(state: StreamState, config: Config, now_ms: int) -> list[str]:
    """An error per object still holding an erased bucket's bytes past the erasure deadline."""
    report = erasure_report(
        state, now_ms, int(config.erasure_deadline_s * 1000), int(config.gc_grace_s * 1000)
    )
    return [
        f"{obj.key}: still holds {obj.bytes} bytes of erased bucket {bucket!r} past the erasure deadline "
        f"({obj.status})"
        for bucket, obj in report.overdue
    ]


async def _verify_payload(
    store: ObjectStore,
    key: str,
    digest: PayloadDigest,
    report: VerifyReport,
    on_bytes: Callable[[bytes], None] | None = None,
) -> bool:
    """Every block of a payload object against its reference's CRC32Cs, and the whole object's.

    ``on_bytes`` sees every byte checked (the digests hash it); True once all were read and matched.
    """
    try:
        await verify_payload(store, key, digest, on_bytes=on_bytes)
    except ObjectNotFound:
        report.errors.append(f"{key}: missing from the object store (metadata references it)")
        return False
    except PayloadDamaged as exc:
        report.errors.append(f"{key}: {exc}")
        return False
    except ObjectStoreError as exc:
        report.errors.append(f"{key}: cannot be read: {exc}")
        return False
    report.objects += 1
    report.bytes += digest.size
    return True


def _check_range(
    rows: list[tuple[int, int, int]], start: int, end: int, holes: tuple[tuple[int, int], ...] = ()
) -> str | None:
    """Rows (start, end, payload length) must tile [start, end) exactly, but for rows a compaction
    rewrite dropped: a gap wholly inside one of the stream's ``holes`` (merged) is allowed."""
    pos = start
    for r_start, r_end, length in rows:
        if r_end <= start or r_start >= end:
            continue
        if r_end - r_start != length:
            return f"record at {r_start} has {length} payload bytes for {r_end - r_start} offsets"
        if not continues(holes, pos, r_start):
            return f"gap or overlap at offset {pos} (next record starts at {r_start})"
        pos = r_end
    if not continues(holes, pos, end):
        return f"rows cover only up to {pos}"
    return None


class _Progress:
    """A one-line progress bar on a terminal; silent otherwise."""

    def __init__(self, total: int, out: TextIO | None) -> None:
        self.total = total
        self.n = 0
        self.out = out if out is not None and out.isatty() else None

    def step(self, label: str) -> None:
        self.n += 1
        if self.out is not None and self.total:
            width = 30
            filled = width * self.n // self.total
            self.out.write(
                f"\r[{'#' * filled}{'.' * (width - filled)}] {self.n}/{self.total} {label[-40:]:40}"
            )
            self.out.flush()

    def done(self) -> None:
        if self.out is not None:
            self.out.write("\n")


async def run_verify(config: Config) -> int:
    if not config.data_path.is_dir():
        print(f"tiered verify: data dir {config.data_path} does not exist", file=sys.stderr)
        return 2
    state, log_ = await asyncio.to_thread(open_read_only, config)
    try:
        hot = await asyncio.to_thread(verify_hot, state, log_)
    finally:
        log_.close()
    c = config
    store = await open_store(c, read_only=True, probe=False)
    tally = verify_digests.DigestTally()
    try:
        report = await verify_cold(state, store, sys.stderr, tally)
    finally:
        await store.close()
    for s in state.streams.values():
        verify_digests.check_stream(s, config.data_path / "hot", tally)
    report.segments = hot.segments
    report.errors[:0] = hot.errors
    report.errors.extend(verify_erasure(state, config, SystemClock().now_ms()))
    report.errors.extend(tally.errors)
    print(f"hot segments:     {report.segments}")
    print(f"objects verified: {report.objects}")
    print(f"bytes read:       {report.bytes}")
    print(f"stream ranges:    {report.ranges}")
    print(f"streams:          {len(state.streams)}")
    print(
        f"digests checked:  {tally.streams_checked} streams ({tally.streams_unchecked} from before digests)"
    )
    print(f"errors:           {len(report.errors)}")
    for err in report.errors:
        print(f"  ERROR {err}")
    return 0 if report.ok else 1
