"""The hot segment log: an append-only sequence of segment files on local disk.

All streams share one log, so a group commit of many appends to many streams
costs one write and one fdatasync. Appending happens on the event-loop thread
and only touches in-memory buffers; writing and syncing happen on one worker
thread (``write_batch``), so the loop keeps accepting requests while the disk
works. The two sides share nothing but the hand-off of a ``WriteBatch``.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tiered.hot.segment import (
    FRAME_SIZE,
    HEADER_SIZE,
    MAGIC,
    MARKER_FRAME_SIZE,
    CorruptSegmentError,
    Damage,
    DamagedRecordError,
    ScanResult,
    check_frames,
    frame,
    fsync_dir,
    later_batch_marker,
    marker_frame,
    parse_segment_name,
    scan_segment,
    segment_name,
)

DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True, order=True)
class LogPosition:
    """A byte position in the log: which segment, and where in it."""

    segment: int
    offset: int


class SegmentUnchecked(Exception):
    """A read needs a segment whose checksums were not checked yet (see ``SegmentLog.check_segment``)."""

    def __init__(self, segment: int) -> None:
        super().__init__(f"segment {segment} is not checked yet")
        self.segment = segment


@dataclass(frozen=True, slots=True)
class CutTail:
    """Bytes recovery cut off the end of the newest segment as the remains of an interrupted write."""

    segment: int
    position: int
    data: bytes
    reason: str


@dataclass(slots=True)
class BatchPart:
    """The bytes of one write to one segment; ``marker_at`` is where its batch marker goes."""

    segment: int
    data: bytearray
    marker_at: int | None = None


@dataclass(slots=True)
class WriteBatch:
    """Framed bytes waiting to be written, grouped by segment, in log order."""

    parts: list[BatchPart] = field(default_factory=list)
    end: LogPosition = LogPosition(0, 0)

    @property
    def nbytes(self) -> int:
        parts = self.parts
        if len(parts) == 1:  # the usual batch (one segment): asked on every append (backpressure)
            return len(parts[0].data)
        return sum(len(p.data) for p in parts)


class SegmentLog:
    """Append-only, checksummed, segmented log with crash recovery."""

    def __init__(
        self,
        directory: str | Path,
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        max_batch_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        # A torn tail can never be longer than one write, which is bounded by this.
        self.max_batch_bytes = max_batch_bytes
        # Append side (event loop thread).
        self._seg = 0
        self._size = 0
        self._pending = WriteBatch()
        # Write side (worker thread).
        self._write_fd: int | None = None
        self._write_seg = 0
        self._written: dict[int, int] = {}
        # Read side: cached read-only descriptors.
        self._read_fds: dict[int, int] = {}
        self._read_lock = threading.Lock()
        self._maps: dict[int, mmap.mmap] = {}
        self._opened = False
        # Checksums are checked once per record and remembered: each segment is
        # verified up to ``_checked_to`` (recovery's scan, this process's own
        # writes, or a lazy check on first read), with damaged frames listed.
        self._checked_to: dict[int, int] = {}
        self._damage: dict[int, list[Damage]] = {}
        self._check_lock = threading.Lock()
        self.cut_tails: list[CutTail] = []

    # ---------------------------------------------------------------- recovery

    def segment_ids(self) -> list[int]:
        ids = []
        for name in os.listdir(self.directory):
            sid = parse_segment_name(name)
            if sid is not None:
                ids.append(sid)
        return sorted(ids)

    def open(
        self, replay_from: LogPosition | None = None, *, read_only: bool = False
    ) -> Iterator[tuple[LogPosition, bytes]]:
        """Verify the log, cut off a torn tail, and yield records to replay.

        Yields ``(body_position, body)`` for every record at or after
        ``replay_from``. Must be fully consumed before appending.
        ``read_only`` (for inspection tools) leaves a torn tail in place.
        """
        if not read_only:
            self.directory.mkdir(parents=True, exist_ok=True)
        ids = self.segment_ids() if self.directory.is_dir() else []
        start = replay_from or LogPosition(0, 0)
        if ids and start.segment > ids[-1]:
            raise CorruptSegmentError(
                f"snapshot refers to segment {start.segment} but the newest segment is {ids[-1]}"
            )
        for i, sid in enumerate(ids):
            last = i == len(ids) - 1
            path = self.directory / segment_name(sid)
            if sid < start.segment:
                if last:
                    raise CorruptSegmentError(f"segment {sid} predates the snapshot position {start}")
                continue  # checked lazily, on first read
            from_pos = start.offset if sid == start.segment else HEADER_SIZE
            # Frames before the snapshot position are checked too; damage there only fails reads of it.
            result = scan_segment(str(path), from_pos)
            if sid == start.segment and result.valid_end < start.offset:
                raise CorruptSegmentError(
                    f"{path}: verified records end at {result.valid_end}, before the snapshot position "
                    f"{start.offset}: acknowledged history is missing or damaged"
                )
            if result.torn_reason is not None:
                if not last:
                    raise CorruptSegmentError(f"{path}: {result.torn_reason} in a sealed segment")
                if not self._is_torn_tail(result, str(path)):
                    raise CorruptSegmentError(
                        f"{path}: {result.torn_reason}, with data written after it: corruption inside "
                        "acknowledged history, refusing to start"
                    )
                if result.valid_end < result.file_size:
                    with open(path, "rb") as f:
                        f.seek(result.valid_end)
                        cut = f.read()
                    self.cut_tails.append(CutTail(sid, result.valid_end, cut, result.torn_reason))
                if not read_only:
                    self._truncate(path, result.valid_end)
            self._checked_to[sid] = result.valid_end
            if result.damage:
                self._damage[sid] = list(result.damage)
            for rec in result.records:
                if rec.body_pos >= from_pos:
                    yield LogPosition(sid, rec.body_pos), rec.body
            if last:
                self._seg = sid
                self._size = max(result.valid_end, HEADER_SIZE)
                self._written[sid] = result.valid_end
        if not ids:
            self._seg = 1
            self._size = HEADER_SIZE
            self._new_part(1, with_magic=True)
        elif self._written[self._seg] < HEADER_SIZE:
            # The newest segment lost its header in a crash: rewrite it whole.
            self._written[self._seg] = 0
            self._size = HEADER_SIZE
            self._new_part(self._seg, with_magic=True)
        self._write_seg = self._seg
        self._opened = True

    def _is_torn_tail(self, result: ScanResult, path: str) -> bool:
        """Can the unverifiable bytes only be the unacknowledged last write?"""
        if result.torn_within_last_batch():
            return True
        tail = result.file_size - result.valid_end
        if tail > self.max_batch_bytes + MARKER_FRAME_SIZE:
            return False
        # The next batch's own marker is what broke, right where it should start
        # (or no batch completed in this segment at all) - and no whole batch
        # was written after it.
        if not (result.batch_end == result.valid_end or result.batch_start is None):
            return False
        return later_batch_marker(path, result.valid_end + 1) is None

    def _truncate(self, path: Path, size: int) -> None:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)

    # ----------------------------------------------------------- append side

    def _new_part(self, seg: int, *, with_magic: bool) -> BatchPart:
        """Start a write to ``seg`` (a new segment starts with its magic)."""
        part = BatchPart(seg, bytearray(MAGIC) if with_magic else bytearray())
        self._pending.parts.append(part)
        return part

    def append(self, body: bytes) -> LogPosition:
        """Frame ``body`` into the pending batch; return where the body will live."""
        if not body:
            raise ValueError("log records are never empty (an empty frame reads as torn)")
        data = frame(body)
        if self._size + len(data) + MARKER_FRAME_SIZE > self.segment_bytes and self._size > HEADER_SIZE:
            self._seg += 1
            self._size = HEADER_SIZE
            self._new_part(self._seg, with_magic=True)
        parts = self._pending.parts
        part = (
            parts[-1]
            if parts and parts[-1].segment == self._seg
            else self._new_part(self._seg, with_magic=False)
        )
        if part.marker_at is None:  # the first record of this write: room for its marker
            part.marker_at = len(part.data)
            part.data.extend(bytes(MARKER_FRAME_SIZE))
            self._size += MARKER_FRAME_SIZE
        part.data.extend(data)
        pos = LogPosition(self._seg, self._size + FRAME_SIZE)
        self._size += len(data)
        return pos

    @property
    def end(self) -> LogPosition:
        """Position just past the last appended record (written or not)."""
        return LogPosition(self._seg, self._size)

    @property
    def pending_bytes(self) -> int:
        return self._pending.nbytes

    def take_batch(self) -> WriteBatch | None:
        if not self._pending.parts:
            return None
        batch = self._pending
        batch.end = self.end
        for part in batch.parts:
            at = part.marker_at
            if at is not None:
                part.data[at : at + MARKER_FRAME_SIZE] = marker_frame(len(part.data) - at)
        self._pending = WriteBatch()
        return batch

    # ------------------------------------------------------------ write side

    def write_batch(self, batch: WriteBatch, *, sync: bool) -> None:
        """Write a batch in order (worker thread). Sealed segments are always synced."""
        for part in batch.parts:
            seg, data = part.segment, part.data
            if seg != self._write_seg or self._write_fd is None:
                self._switch_segment(seg)
            fd = self._write_fd
            assert fd is not None
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            before = self._written.get(seg, 0)
            self._written[seg] = before + len(data)
            if self._checked_to.get(seg, 0) >= before:
                # Framed from memory with checksums of these very bytes: checked as written.
                self._checked_to[seg] = before + len(data)
        if sync and self._write_fd is not None:
            os.fdatasync(self._write_fd)

    def sync(self) -> None:
        if self._write_fd is not None:
            os.fdatasync(self._write_fd)

    def _switch_segment(self, seg: int) -> None:
        if self._write_fd is not None:
            if seg != self._write_seg:
                os.fdatasync(self._write_fd)
            os.close(self._write_fd)
            self._write_fd = None
        path = self.directory / segment_name(seg)
        created = not path.exists()
        self._write_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._write_seg = seg
        if created:
            fsync_dir(str(self.directory))

    def written_size(self, seg: int) -> int:
        return self._written.get(seg, 0)

    # ------------------------------------------------------------- read side

    def read(self, seg: int, pos: int, length: int, *, inline_check: bool = True) -> bytes:
        """Read bytes that are already written (callers only read visible data).

        The record's checksum is checked first (once per record, remembered);
        damage raises ``DamagedRecordError``. ``inline_check=False`` raises
        ``SegmentUnchecked`` instead of checking a segment here, so an event
        loop can run ``check_segment`` on a worker thread.
        """
        self._verify(seg, pos, pos + length, inline_check)
        fd = self._read_fds.get(seg)
        if fd is None:
            with self._read_lock:
                fd = self._read_fds.get(seg)
                if fd is None:
                    fd = os.open(self.directory / segment_name(seg), os.O_RDONLY)
                    self._read_fds[seg] = fd
        data = os.pread(fd, length, pos)
        if len(data) != length:
            raise CorruptSegmentError(f"short read in segment {seg} at {pos}: {len(data)} of {length}")
        return data

    # ---------------------------------------------------------- checksums

    def _verify(self, seg: int, pos: int, end: int, inline_check: bool) -> None:
        if end > self._checked_to.get(seg, 0):
            if not inline_check:
                raise SegmentUnchecked(seg)
            self.check_segment(seg)
        damage = self._damage.get(seg)
        if damage:
            for d in damage:
                if d.start < end and pos < d.end:
                    raise DamagedRecordError(seg, d.start, d.reason)

    def check_segment(self, seg: int) -> list[Damage]:
        """Check every frame of ``seg`` not checked yet; returns its damage (blocking, thread-safe)."""
        with self._check_lock:
            start = max(self._checked_to.get(seg, 0), HEADER_SIZE)
            path = self.directory / segment_name(seg)
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                limit = self._written.get(seg, size) if seg == self._seg else size
                if start < limit:
                    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                        if mm[:HEADER_SIZE] != MAGIC:
                            damage = [Damage(0, limit, "bad segment magic")]
                        else:
                            _, damage = check_frames(mm, start, limit)
                    if damage:
                        self._damage.setdefault(seg, []).extend(damage)
                    self._checked_to[seg] = limit
            return list(self._damage.get(seg, ()))

    def damage(self) -> dict[int, list[Damage]]:
        """Damaged frames found so far, by segment."""
        return {seg: list(d) for seg, d in self._damage.items() if d}

    def _mapped(self, seg: int, need: int) -> mmap.mmap:
        """A read-only map of ``seg`` covering at least ``need`` bytes (event-loop thread only)."""
        mm = self._maps.get(seg)
        if mm is None or len(mm) < need:
            if mm is not None:
                mm.close()
            fd = os.open(self.directory / segment_name(seg), os.O_RDONLY)
            try:
                mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            finally:
                os.close(fd)
            if len(mm) < need:
                raise CorruptSegmentError(f"segment {seg} is shorter ({len(mm)}) than its records ({need})")
            self._maps[seg] = mm
        return mm

    def read_run(
        self,
        starts: Sequence[int],
        lens: Sequence[int],
        segs: Sequence[int],
        poss: Sequence[int],
        i: int,
        start: int,
        end: int,
    ) -> bytes:
        """Stream bytes ``[start, end)`` from consecutive index entries ``i, i+1, ...``.

        The catch-up hot path: one slice of a memory map per record instead of
        a syscall and an object per record. Event-loop thread only: a segment
        not checked yet raises ``SegmentUnchecked``, damage ``DamagedRecordError``.
        """
        parts: list[bytes] = []
        n = len(starts)
        cur_seg, mm, mapped, checked, damaged = -1, None, 0, 0, False
        while i < n:
            cs = starts[i]
            if cs >= end:
                break
            cl, seg, pos = lens[i], segs[i], poss[i]
            if seg != cur_seg or pos + cl > mapped:
                mm = self._mapped(seg, pos + cl)
                cur_seg, mapped = seg, len(mm)
                checked, damaged = self._checked_to.get(seg, 0), bool(self._damage.get(seg))
            if pos + cl > checked or damaged:
                self._verify(seg, pos, pos + cl, False)
                checked = self._checked_to.get(seg, 0)
            lo = start - cs if start > cs else 0
            hi = end - cs if end < cs + cl else cl
            parts.append(mm[pos + lo : pos + hi])  # type: ignore[index]
            i += 1
        return b"".join(parts)

    # ------------------------------------------------------------ management

    def delete_segment(self, seg: int) -> None:
        """Remove a segment whose records are no longer needed (never the active one)."""
        if seg >= self._seg:
            raise ValueError("cannot delete the active segment")
        with self._read_lock:
            fd = self._read_fds.pop(seg, None)
        if fd is not None:
            os.close(fd)
        mm = self._maps.pop(seg, None)
        if mm is not None:
            mm.close()
        try:
            os.unlink(self.directory / segment_name(seg))
        except FileNotFoundError:
            pass
        self._written.pop(seg, None)
        with self._check_lock:
            self._checked_to.pop(seg, None)
            self._damage.pop(seg, None)

    def close(self) -> None:
        if self._write_fd is not None:
            os.fdatasync(self._write_fd)
            os.close(self._write_fd)
            self._write_fd = None
        with self._read_lock:
            for fd in self._read_fds.values():
                os.close(fd)
            self._read_fds.clear()
        for mm in self._maps.values():
            mm.close()
        self._maps.clear()
